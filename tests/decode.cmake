# LLM decoding: the DecodeScheduler's policy as pure functions and the
# scheduler with a deterministic stand-in model and real threads (host). The
# scheduler is the optional component replay::decode (cmake/ReplayDecode.cmake).
replay_add_test(NAME decode_host SOURCES host/decode_test.cpp SUITES host LIBRARIES replay::decode)

# Every decode header compiles on its own, under g++ and nvcc, twice in a row.
file(GLOB_RECURSE _replay_decode_headers RELATIVE ${PROJECT_SOURCE_DIR}/include CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/include/replay/decode/*.hpp)
replay_header_check(NAME replay_decode_header_check HEADERS replay/decode.hpp ${_replay_decode_headers}
                    LIBRARIES replay::decode)
