# cmake -DPLANNER=<planner binary> -DSOURCE_DIR=<repository root> -P cmake/ValidationDocs.cmake
# The validation record: writes docs/validation.md and docs/validation.json with `planner validate`
# and puts the Markdown summary table into README.md between the two marker comments
# ("<!-- begin validation summary" ... "<!-- end validation summary -->"), and each table marked
# "<!-- begin validation table ID" ... "<!-- end validation table ID -->" (ID: a table id of
# `planner validate`) between its markers. Run by the `validation_docs` target
# (planner/CMakeLists.txt).
foreach(required PLANNER SOURCE_DIR)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "ValidationDocs.cmake: -D${required}=... is required")
  endif()
endforeach()

foreach(format md json)
  set(output "${SOURCE_DIR}/docs/validation.${format}")
  execute_process(COMMAND "${PLANNER}" validate --format ${format} OUTPUT_FILE "${output}" RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "planner validate --format ${format} exited with ${status}")
  endif()
endforeach()

# The sample reports: the flagship question and every sample plan, as Markdown.
file(MAKE_DIRECTORY "${SOURCE_DIR}/docs/reports")
# NAME|ARG,ARG,...: the report's file stem and the planner's arguments.
set(reports
  "llama3-70b-64xdgx-h100|--model,70b,--gpus,64,--format,md"
  "llama3-70b-64xh100-auto|search,samples/plans/llama3-70b-64xh100-auto.json,--format,md"
  "gpt3-175b-1024xa100|evaluate,samples/plans/gpt3-175b-1024xa100.json,--format,md"
  "llama3-8b-lora-8xh100|evaluate,samples/plans/llama3-8b-lora-8xh100.json,--format,md"
  "tiny-llama-pp4|evaluate,samples/plans/tiny-llama-pp4.json,--format,md")
foreach(report IN LISTS reports)
  string(REPLACE "|" ";" parts "${report}")
  string(REPLACE "," ";" parts "${parts}")
  list(GET parts 0 name)
  list(SUBLIST parts 1 -1 args)
  execute_process(COMMAND "${PLANNER}" ${args} WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE text RESULT_VARIABLE status)
  if(NOT status EQUAL 0 AND NOT status EQUAL 1)
    message(FATAL_ERROR "planner ${args} exited with ${status}")
  endif()
  # The search time changes from run to run; the record keeps the plans, not the stopwatch.
  string(REGEX REPLACE "Searched  ([0-9.]+( [KMBT])?) plans in [0-9.]+ s \\([^)]*\\)" "Searched  \\1 plans" text "${text}")
  file(WRITE "${SOURCE_DIR}/docs/reports/${name}.md" "${text}")
  if(name STREQUAL "llama3-70b-64xdgx-h100")
    string(REGEX MATCH "## Recommended: [^\n]*\n  Why: [^\n]*\n" recommendation "${text}")
    string(REPLACE "## " "" recommendation "${recommendation}")
    set(recommendation "```\n${recommendation}```\n")
  endif()
endforeach()

file(READ "${SOURCE_DIR}/docs/validation.md" markdown)
string(FIND "${markdown}" "## Summary\n\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "docs/validation.md has no \"## Summary\" section")
endif()
math(EXPR at "${at} + 12")  # past "## Summary\n\n"
string(SUBSTRING "${markdown}" ${at} -1 summary)

set(readme_file "${SOURCE_DIR}/README.md")
file(READ "${readme_file}" readme)

# Replaces what lies between "<!-- begin NAME...-->\n" and "<!-- end NAME -->" in `readme`.
function(replace_block name content)
  string(FIND "${readme}" "<!-- begin ${name}" begin)
  string(FIND "${readme}" "<!-- end ${name} -->" end)
  if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
    message(FATAL_ERROR "README.md: the markers of \"${name}\" are missing")
  endif()
  string(SUBSTRING "${readme}" ${begin} -1 from_begin)
  string(FIND "${from_begin}" "-->\n" marker_end)
  math(EXPR head_length "${begin} + ${marker_end} + 4")
  string(SUBSTRING "${readme}" 0 ${head_length} head)
  string(SUBSTRING "${readme}" ${end} -1 tail)
  set(readme "${head}${content}${tail}" PARENT_SCOPE)
endfunction()

replace_block("validation summary" "${summary}")
replace_block("sample recommendation" "${recommendation}")

# Tables by id: the block after "Table id `ID`.\n\n" up to the next section.
string(REGEX MATCHALL "<!-- begin validation table [a-z0-9_]+" marked "${readme}")
foreach(marker IN LISTS marked)
  string(REPLACE "<!-- begin validation table " "" id "${marker}")
  string(FIND "${markdown}" "Table id `${id}`.\n\n" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "docs/validation.md has no table with id ${id}")
  endif()
  string(LENGTH "Table id `${id}`.\n\n" skip)
  math(EXPR at "${at} + ${skip}")
  string(SUBSTRING "${markdown}" ${at} -1 rest)
  string(FIND "${rest}" "\n## " next)
  if(NOT next EQUAL -1)
    math(EXPR next "${next} + 1")
    string(SUBSTRING "${rest}" 0 ${next} rest)
  endif()
  replace_block("validation table ${id}" "${rest}")
endforeach()

file(WRITE "${readme_file}.tmp" "${readme}")
file(COPY_FILE "${readme_file}.tmp" "${readme_file}" ONLY_IF_DIFFERENT)
file(REMOVE "${readme_file}.tmp")
message(STATUS "wrote docs/validation.md, docs/validation.json and the marked tables in README.md")
