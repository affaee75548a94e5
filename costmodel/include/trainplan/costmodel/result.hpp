#pragma once
// Result<T>: a value or an Error whose message names what was wrong and where
// ("plan.json: /parallel/tp: must divide heads (64)"). Input errors travel as Results;
// only main() turns them into an exit code.

#include <cstdlib>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace trainplan::costmodel {

struct Error {
  std::string message;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : data_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Error error) : data_(std::move(error)) {}    // NOLINT: implicit by design

  [[nodiscard]] bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }

  // REQUIRES: ok(). Calling value() on an error is a programmer error and aborts.
  [[nodiscard]] const T& value() const& { check(); return std::get<T>(data_); }
  [[nodiscard]] T& value() & { check(); return std::get<T>(data_); }
  [[nodiscard]] T&& value() && { check(); return std::get<T>(std::move(data_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }

  // REQUIRES: !ok().
  [[nodiscard]] const Error& error() const { return std::get<Error>(data_); }

 private:
  void check() const {
    if (!ok()) {
      std::fprintf(stderr, "%s:%d: Result::value() on error: %s\n", __FILE__, __LINE__,
                   std::get<Error>(data_).message.c_str());
      std::abort();
    }
  }
  std::variant<T, Error> data_;
};

}  // namespace trainplan::costmodel
