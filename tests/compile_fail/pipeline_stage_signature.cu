// A StreamPipeline compute stage without the replay::StreamRef parameter is
// refused with a message naming the expected signature.
// expect-error: StreamPipeline's compute stage takes no stream
#include <replay/stream_pipeline.hpp>

int main() {
  replay::StreamPipeline<float> pipeline(replay::PipelineOptions{},
                                         [](replay::BufferView<float> in, replay::BufferView<float> out) {});
  return 0;
}
