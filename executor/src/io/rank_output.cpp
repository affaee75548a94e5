// Rank-prefixed messages on standard error (see rank_output.hpp).

#include "rank_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>

namespace trainplan::executor {

std::string rank_prefixed(int rank, const std::string& text) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out += prefix;
    out.append(text, start, end - start);
    out += '\n';
    start = end + 1;
  }
  if (out.empty()) out = prefix + "\n";
  return out;
}

void print_for_rank(int rank, const std::string& text) {
  std::cerr.flush();
  std::fflush(stderr);
  const std::string message = rank_prefixed(rank, text);
  const char* p = message.data();
  std::size_t left = message.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report it
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

}  // namespace trainplan::executor
