# StreamPipeline: the scheduling core on the CPU with a fake stage runner
# (suite host), and the CUDA pipeline on the device (suite gpu).
find_package(Threads REQUIRED)
replay_add_test(NAME stream_pipeline
                SOURCES host/stream_pipeline_test.cpp gpu/stream_pipeline_test.cu
                SUITES host gpu
                LIBRARIES Threads::Threads)
