# Extracts the code blocks of README.md that follow a marker line
#   <!-- readme-test: <file name> -->
# into WORK_DIR/src/<file name>, then configures, builds and runs that project
# with run_cmake_project.cmake (DRIVER). Fails when no marked block is found,
# so the test cannot pass having built nothing.
#   cmake -DREADME=... -DWORK_DIR=... -DGENERATOR=... -DARGS=a|b -DDRIVER=... -P readme_blocks.cmake
cmake_minimum_required(VERSION 3.24)
file(STRINGS "${README}" lines ENCODING UTF-8)
file(REMOVE_RECURSE "${WORK_DIR}")
set(target_file "")
set(in_block FALSE)
set(written "")
set(content "")
foreach(line IN LISTS lines)
  if(in_block)
    if(line MATCHES "^```")
      file(WRITE "${WORK_DIR}/src/${target_file}" "${content}")
      list(APPEND written ${target_file})
      set(in_block FALSE)
      set(target_file "")
    else()
      string(APPEND content "${line}\n")
    endif()
  elseif(line MATCHES "^<!-- readme-test: ([A-Za-z0-9_.]+) -->$")
    set(target_file ${CMAKE_MATCH_1})
  elseif(target_file AND line MATCHES "^```")
    set(in_block TRUE)
    set(content "")
  endif()
endforeach()
if(NOT "CMakeLists.txt" IN_LIST written)
  message(FATAL_ERROR "README.md has no block marked <!-- readme-test: CMakeLists.txt -->")
endif()
list(LENGTH written count)
if(count LESS 2)
  message(FATAL_ERROR "README.md: expected the CMakeLists.txt and at least one source, found: ${written}")
endif()
message(STATUS "README blocks: ${written}")
execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${WORK_DIR}/src -DBINARY_DIR=${WORK_DIR}/build
                        "-DGENERATOR=${GENERATOR}" "-DARGS=${ARGS}" -DRUN=my_server
                        -DONE_CUDA_RUNTIME=my_server:static -P ${DRIVER}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the README's project did not configure, build and run (see above)")
endif()
