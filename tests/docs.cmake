# The API reference (Doxygen, docs/Doxyfile.in) as a test, label docs:
# docs.api_reference fails on a Doxygen warning that is not in
# tests/docs/doxygen-baseline.txt. Targets: `docs` builds the reference into
# <build>/docs/html; `docs_baseline` accepts the current warnings.
find_program(REPLAY_DOXYGEN_EXECUTABLE doxygen DOC "Doxygen, for the API reference")
set(REPLAY_DOCS_OUTPUT ${PROJECT_BINARY_DIR}/docs)
configure_file(${PROJECT_SOURCE_DIR}/docs/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
set(_replay_docs_args -DDOXYGEN=${REPLAY_DOXYGEN_EXECUTABLE} -DDOXYFILE=${PROJECT_BINARY_DIR}/Doxyfile
    -DOUTPUT=${REPLAY_DOCS_OUTPUT} -DBASELINE=${CMAKE_CURRENT_SOURCE_DIR}/docs/doxygen-baseline.txt)
set(_replay_docs_script -P ${CMAKE_CURRENT_SOURCE_DIR}/docs/check_doxygen.cmake)
add_test(NAME docs.api_reference COMMAND ${CMAKE_COMMAND} ${_replay_docs_args} ${_replay_docs_script})
set_tests_properties(docs.api_reference PROPERTIES LABELS docs TIMEOUT 300)
add_custom_target(docs COMMAND ${CMAKE_COMMAND} ${_replay_docs_args} ${_replay_docs_script} USES_TERMINAL VERBATIM)
add_custom_target(docs_baseline COMMAND ${CMAKE_COMMAND} -DUPDATE_BASELINE=ON ${_replay_docs_args} ${_replay_docs_script}
                  USES_TERMINAL VERBATIM)
