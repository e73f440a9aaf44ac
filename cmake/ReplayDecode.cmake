# The decode scheduler (include/replay/decode.hpp, replay/decode/): INTERFACE
# target replay_decode (alias replay::decode) = replay::replay + the threads
# library (the scheduler's worker thread). It calls no CUDA and needs nothing
# else, so it is always defined; it is optional in that replay/replay.hpp does
# not include it and replay::replay does not carry it: include
# <replay/decode.hpp> and link replay::decode (find_package: COMPONENTS decode).
find_package(Threads REQUIRED)
add_library(replay_decode INTERFACE)
add_library(replay::decode ALIAS replay_decode)
target_link_libraries(replay_decode INTERFACE replay::replay Threads::Threads)
