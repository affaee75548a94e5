#pragma once
// Messages a rank prints on standard error: every line starts with "[rank N] " and the whole
// message goes out in one write(2), so that the lines of ranks failing at once (mpirun and
// torchrun merge their standard errors into one stream) never interleave within a line and say
// whose they are. Free of LibTorch, so tests compile it on its own.

#include <string>

namespace trainplan::executor {

// Every line of `text` prefixed with "[rank N] ", each ending in a newline (one is added at the
// end when missing). rank_prefixed(1, "a\nb") == "[rank 1] a\n[rank 1] b\n".
[[nodiscard]] std::string rank_prefixed(int rank, const std::string& text);

// Writes rank_prefixed(rank, text) to standard error with one write(2) (continued on a partial
// write), after flushing std::cerr and stderr so that earlier output stays in order.
void print_for_rank(int rank, const std::string& text);

}  // namespace trainplan::executor
