#pragma once
// Private to costmodel: strict reading of JSON documents. Every read names the file and the
// JSON pointer of the value; unknown keys are rejected by finish(). Errors are thrown as
// DocumentError inside the loaders and turned into Result errors at the public boundary.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainplan::costmodel::detail {

class DocumentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "file: /pointer: rule"
[[noreturn]] void fail_at(const std::string& file, const std::string& pointer, const std::string& rule);

// Parses text as JSON; syntax errors name the file, line and column, and a key repeated in one
// object is refused naming the key's JSON pointer ("f.json: /parallel/tp: duplicate key \"tp\" ...").
nlohmann::json parse_json(const std::string& text, const std::string& file);

class ObjectReader {
 public:
  // REQUIRES: json outlives the reader. Fails if json is not an object.
  ObjectReader(const nlohmann::json& json, std::string file, std::string pointer);

  [[nodiscard]] bool has(const std::string& key) const;
  // True when the key is present with the value null (has() is false for it too).
  [[nodiscard]] bool is_null(const std::string& key) const { return json_.contains(key) && json_.at(key).is_null(); }
  [[nodiscard]] std::string pointer(const std::string& key) const { return pointer_ + "/" + key; }
  [[nodiscard]] const std::string& file() const { return file_; }
  [[nodiscard]] const std::string& base_pointer() const { return pointer_; }

  // A finite number in [min, max]; `exclusive_min` makes the lower bound strict (> min).
  double number(const std::string& key, double min, double max, bool exclusive_min = false);
  std::optional<double> optional_number(const std::string& key, double min, double max,
                                        bool exclusive_min = false);
  // An integral number in [min, max].
  std::int64_t integer(const std::string& key, std::int64_t min, std::int64_t max);
  std::optional<std::int64_t> optional_integer(const std::string& key, std::int64_t min,
                                               std::int64_t max);
  bool boolean(const std::string& key);
  std::optional<bool> optional_boolean(const std::string& key);
  std::string string(const std::string& key);
  std::optional<std::string> optional_string(const std::string& key);
  std::string one_of(const std::string& key, std::initializer_list<const char*> choices);
  std::optional<std::string> optional_one_of(const std::string& key,
                                             std::initializer_list<const char*> choices);
  ObjectReader object(const std::string& key);
  // The raw value, marked as read. REQUIRES: has(key).
  const nlohmann::json& raw(const std::string& key);
  // Checks `schema` equals the expected identifier.
  void expect_schema(const std::string& expected);
  // Rejects any key that was never read.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& rule) const;

 private:
  const nlohmann::json& at(const std::string& key);
  const nlohmann::json& json_;
  std::string file_;
  std::string pointer_;
  std::set<std::string> used_;
};

// Rows of a numeric table, `r`'s key `key`: a non-empty array of arrays of `width` numbers, each
// finite and > 0, the first `key_width` numbers of each row (its key) strictly increasing
// lexicographically; `key_names` names them for the message ("m, n, k"). Fails naming the
// pointer of the offending row or value.
std::vector<std::vector<double>> read_number_rows(ObjectReader& r, const std::string& key, std::size_t width, std::size_t key_width,
                                                  const char* key_names);
// Fails unless `r`'s "columns" is exactly `names`.
void expect_columns(ObjectReader& r, std::initializer_list<const char*> names);

}  // namespace trainplan::costmodel::detail
