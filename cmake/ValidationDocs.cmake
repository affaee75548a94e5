# cmake -DPLANNER=<planner binary> -DSOURCE_DIR=<repository root> -P cmake/ValidationDocs.cmake
# The validation record: writes docs/validation.md and docs/validation.json with `planner validate`
# and puts the Markdown summary table between the two marker comments ("<!-- begin validation
# summary" ... "<!-- end validation summary -->") of README.md, and each table marked
# "<!-- begin validation table ID" ... "<!-- end validation table ID -->" (ID: a table id of
# `planner validate`) between its markers, in README.md or any page of docs/. Run by the `validation_docs` target
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

# The marked blocks live in README.md (the summary and the sample recommendation) and in the
# topic pages under docs/ (the tables by id); every marked block of every page is rewritten, and
# the summary and the recommendation must be marked somewhere.
file(GLOB pages "${SOURCE_DIR}/docs/*.md")
list(REMOVE_ITEM pages "${SOURCE_DIR}/docs/validation.md")
list(PREPEND pages "${SOURCE_DIR}/README.md")

# Replaces what lies between "<!-- begin NAME...-->\n" and "<!-- end NAME -->" in `page`, where
# the page has those markers; sets `replaced` when it did.
function(replace_block name content)
  string(FIND "${page}" "<!-- begin ${name}" begin)
  string(FIND "${page}" "<!-- end ${name} -->" end)
  if(begin EQUAL -1 AND end EQUAL -1)
    return()
  endif()
  if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
    message(FATAL_ERROR "${page_file}: the markers of \"${name}\" are unbalanced")
  endif()
  string(SUBSTRING "${page}" ${begin} -1 from_begin)
  string(FIND "${from_begin}" "-->\n" marker_end)
  math(EXPR head_length "${begin} + ${marker_end} + 4")
  string(SUBSTRING "${page}" 0 ${head_length} head)
  string(SUBSTRING "${page}" ${end} -1 tail)
  set(page "${head}${content}${tail}" PARENT_SCOPE)
  set(replaced TRUE PARENT_SCOPE)
endfunction()

set(summary_written FALSE)
set(recommendation_written FALSE)
foreach(page_file IN LISTS pages)
  file(READ "${page_file}" page)
  set(replaced FALSE)
  replace_block("validation summary" "${summary}")
  if(replaced)
    set(summary_written TRUE)
  endif()
  set(replaced FALSE)
  replace_block("sample recommendation" "${recommendation}")
  if(replaced)
    set(recommendation_written TRUE)
  endif()
  # Tables by id: the block after "Table id `ID`.\n\n" up to the next section.
  string(REGEX MATCHALL "<!-- begin validation table [a-z0-9_]+" marked "${page}")
  foreach(marker IN LISTS marked)
    string(REPLACE "<!-- begin validation table " "" id "${marker}")
    string(FIND "${markdown}" "Table id `${id}`.\n\n" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "docs/validation.md has no table with id ${id} (marked in ${page_file})")
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
  file(WRITE "${page_file}.tmp" "${page}")
  file(COPY_FILE "${page_file}.tmp" "${page_file}" ONLY_IF_DIFFERENT)
  file(REMOVE "${page_file}.tmp")
endforeach()
if(NOT summary_written OR NOT recommendation_written)
  message(FATAL_ERROR "the validation summary and the sample recommendation must each be marked in README.md or a page of docs/")
endif()
message(STATUS "wrote docs/validation.md, docs/validation.json and the marked blocks of README.md and docs/*.md")
