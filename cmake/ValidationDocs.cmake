# cmake -DPLANNER=<planner binary> -DSOURCE_DIR=<repository root> -P cmake/ValidationDocs.cmake
# The validation record: writes docs/validation.md and docs/validation.json with `planner validate`
# and puts the Markdown summary table into README.md between the two marker comments
# ("<!-- begin validation summary" ... "<!-- end validation summary -->"). Run by the
# `validation_docs` target (planner/CMakeLists.txt).
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

file(READ "${SOURCE_DIR}/docs/validation.md" markdown)
string(FIND "${markdown}" "## Summary\n\n" at)
if(at EQUAL -1)
  message(FATAL_ERROR "docs/validation.md has no \"## Summary\" section")
endif()
math(EXPR at "${at} + 12")  # past "## Summary\n\n"
string(SUBSTRING "${markdown}" ${at} -1 summary)

set(readme_file "${SOURCE_DIR}/README.md")
file(READ "${readme_file}" readme)
string(FIND "${readme}" "<!-- begin validation summary" begin)
string(FIND "${readme}" "<!-- end validation summary -->" end)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
  message(FATAL_ERROR "README.md: the validation summary markers are missing")
endif()
string(SUBSTRING "${readme}" ${begin} -1 from_begin)
string(FIND "${from_begin}" "-->\n" marker_end)
math(EXPR head_length "${begin} + ${marker_end} + 4")
string(SUBSTRING "${readme}" 0 ${head_length} head)
string(SUBSTRING "${readme}" ${end} -1 tail)
file(WRITE "${readme_file}.tmp" "${head}${summary}${tail}")
file(COPY_FILE "${readme_file}.tmp" "${readme_file}" ONLY_IF_DIFFERENT)
file(REMOVE "${readme_file}.tmp")
message(STATUS "wrote docs/validation.md, docs/validation.json and the summary in README.md")
