#include <replay/replay.hpp>

int main() { return 0; }
