# Installation and packaging: `cmake --install build --prefix DIR` puts planner, executor (when
# built), trainplan-gui (when built), the preset documents, the sample plans and man pages in
# DIR; `cpack -G DEB` (run in the build directory) builds the Debian package `trainplan`.
include(GNUInstallDirs)

# add_man_page(TARGET <program target> NAME <page> SUMMARY <line> [EXIT_STATUS <text>] [ENVIRONMENT <text>] COMPONENT <c>)
# Generates man1/<NAME>.1 from the program's own --help text (cmake/ManPage.cmake) after each
# build of the program, and installs it.
function(add_man_page)
  cmake_parse_arguments(ARG "" "TARGET;NAME;SUMMARY;EXIT_STATUS;ENVIRONMENT;COMPONENT" "" ${ARGN})
  set(page "${PROJECT_BINARY_DIR}/man/man1/${ARG_NAME}.1")
  set(extra "")
  if(ARG_EXIT_STATUS)
    list(APPEND extra "-DEXIT_STATUS=${ARG_EXIT_STATUS}")
  endif()
  if(ARG_ENVIRONMENT)
    list(APPEND extra "-DENVIRONMENT=${ARG_ENVIRONMENT}")
  endif()
  add_custom_command(OUTPUT "${page}"
    COMMAND ${CMAKE_COMMAND} -E make_directory "${PROJECT_BINARY_DIR}/man/man1"
    COMMAND ${CMAKE_COMMAND} "-DPROGRAM=$<TARGET_FILE:${ARG_TARGET}>" "-DNAME=${ARG_NAME}" "-DSUMMARY=${ARG_SUMMARY}"
            "-DVERSION=${PROJECT_VERSION}" "-DOUTPUT=${page}" ${extra} -P "${PROJECT_SOURCE_DIR}/cmake/ManPage.cmake"
    DEPENDS ${ARG_TARGET} "${PROJECT_SOURCE_DIR}/cmake/ManPage.cmake"
    COMMENT "man page ${ARG_NAME}(1) from ${ARG_NAME} --help"
    VERBATIM)
  add_custom_target(${ARG_NAME}_man ALL DEPENDS "${page}")
  install(FILES "${page}" DESTINATION "${CMAKE_INSTALL_MANDIR}/man1" COMPONENT ${ARG_COMPONENT})
endfunction()

# The documents the tools also carry compiled in: installed so that users copy and edit them.
install(DIRECTORY "${PROJECT_SOURCE_DIR}/hwprofiles/" DESTINATION "${CMAKE_INSTALL_DATADIR}/trainplan/hwprofiles"
        COMPONENT planner FILES_MATCHING PATTERN "*.json")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/samples/" DESTINATION "${CMAKE_INSTALL_DATADIR}/trainplan/samples" COMPONENT planner)
install(FILES "${PROJECT_SOURCE_DIR}/README.md" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT planner)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT planner)  # the pages README.md links to

# The Debian package: planner and the GUI with the presets, samples and man pages. The executor
# is not in it: it links LibTorch from PyPI's torch wheel, which no Debian package provides;
# `cmake --install` installs it with the path to that LibTorch kept in its RUNPATH.
set(CPACK_PACKAGE_NAME trainplan)
set(CPACK_PACKAGE_VENDOR "trainplan")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Plans distributed training of large models: what fits, how fast, and why")
set(CPACK_PACKAGE_CONTACT "trainplan developers <trainplan@localhost>")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from dpkg-shlibdeps (libstdc++, Qt 6, ...)
set(CPACK_COMPONENTS_ALL planner)
if(TRAINPLAN_BUILD_GUI)
  list(APPEND CPACK_COMPONENTS_ALL gui)
endif()
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_GENERATOR DEB)
include(CPack)
