# LLM decoding: the DecodeScheduler's policy as pure functions and the
# scheduler with a deterministic stand-in model and real threads (host).
replay_add_test(NAME decode_host SOURCES host/decode_test.cpp SUITES host LIBRARIES Threads::Threads)
