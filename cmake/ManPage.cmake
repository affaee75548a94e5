# cmake -DPROGRAM=<binary> -DNAME=<name> -DSUMMARY=<one line> -DVERSION=<v> -DOUTPUT=<file.1>
#       [-DEXIT_STATUS=<text>] [-DENVIRONMENT=<text>] -P ManPage.cmake
#
# Writes a man page (man(7) macros) for a CLI11 program from its own --help text, so the page
# never disagrees with the program: NAME and SYNOPSIS, the main help under DESCRIPTION, and one
# subsection per subcommand listed under "Subcommands:" with that subcommand's --help. Runs the
# program, so it is a build step of native builds only (the GUI needs QT_QPA_PLATFORM=offscreen).
foreach(var PROGRAM NAME SUMMARY VERSION OUTPUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "ManPage.cmake: -D${var}= is required")
  endif()
endforeach()

set(ENV{QT_QPA_PLATFORM} offscreen)

function(help_of out)
  execute_process(COMMAND "${PROGRAM}" ${ARGN} --help
                  OUTPUT_VARIABLE text ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ManPage.cmake: ${PROGRAM} ${ARGN} --help exited ${rc}: ${err}")
  endif()
  # The usage line names the binary by the path it was run with; a page names the program.
  string(REGEX REPLACE "Usage: [^ \n]+" "Usage: ${NAME}" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# Text as a no-fill block: backslashes doubled, lines starting with . or ' protected.
function(preformatted out text)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  string(REGEX REPLACE "\n+$" "" text "${text}")
  set(${out} ".nf\n${text}\n.fi\n" PARENT_SCOPE)
endfunction()

help_of(main_help)
preformatted(main_block "${main_help}")
string(TOUPPER "${NAME}" upper)
set(page ".TH ${upper} 1 \"\" \"trainplan ${VERSION}\" \"trainplan manual\"\n")
string(APPEND page ".SH NAME\n${NAME} \\- ${SUMMARY}\n")
string(APPEND page ".SH SYNOPSIS\n.B ${NAME}\n[\\fIOPTIONS\\fR]")
if(main_help MATCHES "\nSubcommands:\n")
  string(APPEND page " [\\fISUBCOMMAND\\fR [\\fIOPTIONS\\fR]]")
endif()
string(APPEND page "\n.SH DESCRIPTION\n${main_block}")

# Subcommands: the indented first words of the lines after "Subcommands:".
string(FIND "${main_help}" "\nSubcommands:\n" at)
if(NOT at EQUAL -1)
  string(SUBSTRING "${main_help}" ${at} -1 list)
  string(REGEX MATCHALL "\n  [a-z][a-z0-9-]*" subcommands "${list}")
  string(APPEND page ".SH SUBCOMMANDS\n")
  foreach(sub IN LISTS subcommands)
    string(STRIP "${sub}" sub)
    help_of(sub_help ${sub})
    preformatted(sub_block "${sub_help}")
    string(APPEND page ".SS ${NAME} ${sub}\n${sub_block}")
  endforeach()
endif()
if(DEFINED EXIT_STATUS)
  string(APPEND page ".SH EXIT STATUS\n${EXIT_STATUS}\n")
endif()
if(DEFINED ENVIRONMENT)
  string(APPEND page ".SH ENVIRONMENT\n${ENVIRONMENT}\n")
endif()
string(APPEND page ".SH SEE ALSO\nThe README.md of trainplan, installed in share/doc/trainplan.\n")
file(WRITE "${OUTPUT}.tmp" "${page}")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
