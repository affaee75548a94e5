#include "json_reader.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace trainplan::costmodel::detail {

void fail_at(const std::string& file, const std::string& pointer, const std::string& rule) {
  throw DocumentError(file + ": " + (pointer.empty() ? "/" : pointer) + ": " + rule);
}

namespace {

// "~" and "/" escaped as a JSON pointer's reference token needs (RFC 6901).
std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// Reads the document's SAX events to know the JSON pointer of every key, and refuses a key an
// object already has: nlohmann would keep the last one silently, so "tp": 8 ... "tp": 1 would
// read as 1 with nothing said. A pass of its own beside the plain parse: nlohmann's callback
// parser scans a container's elements again at each nested object's end (its discarded-value
// removal), quadratic in an array of objects (a measurement's trace events: 20 s for 28 MB).
class DuplicateKeyCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit DuplicateKeyCheck(std::string file) : file_(std::move(file)) {}

  bool null() override { return value(); }
  bool boolean(bool /*val*/) override { return value(); }
  bool number_integer(number_integer_t /*val*/) override { return value(); }
  bool number_unsigned(number_unsigned_t /*val*/) override { return value(); }
  bool number_float(number_float_t /*val*/, const string_t& /*s*/) override { return value(); }
  bool string(string_t& /*val*/) override { return value(); }
  bool binary(binary_t& /*val*/) override { return value(); }
  bool start_object(std::size_t /*elements*/) override { return open(true); }
  bool start_array(std::size_t /*elements*/) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& key) override {
    Frame& object = frames_.back();
    if (!object.keys.insert(key).second) {
      fail_at(file_, pointer() + "/" + pointer_token(key), "duplicate key \"" + key + "\" (each key may appear once in an object)");
    }
    object.current = pointer_token(key);
    return true;
  }
  // The text was parsed once already, with the same options, so no syntax error reaches here.
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const nlohmann::detail::exception& /*e*/) override {
    return false;
  }

 private:
  struct Frame {
    bool object = false;
    std::set<std::string> keys;  // objects: the keys seen so far
    std::string current;         // the reference token of the element being read
    std::size_t next_index = 0;  // arrays: the index of the next element
  };

  bool value() {
    enter_element();
    return true;
  }
  bool open(bool object) {
    enter_element();
    frames_.push_back(Frame{object, {}, {}, 0});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  // A value or container starts: inside an array it is the next element.
  void enter_element() {
    if (!frames_.empty() && !frames_.back().object) frames_.back().current = std::to_string(frames_.back().next_index++);
  }

  // The pointer of the innermost open container.
  std::string pointer() const {
    std::string out;
    for (std::size_t i = 0; i + 1 < frames_.size(); ++i) out += "/" + frames_[i].current;
    return out;
  }

  std::string file_;
  std::vector<Frame> frames_;
};

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& file) {
  try {
    nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    DuplicateKeyCheck keys(file);
    nlohmann::json::sax_parse(text, &keys);
    return json;
  } catch (const nlohmann::json::parse_error& e) {
    // Report the line and column of the byte offset nlohmann gives.
    std::size_t line = 1, column = 1;
    for (std::size_t i = 0; i < e.byte - (e.byte > 0 ? 1 : 0) && i < text.size(); ++i) {
      if (text[i] == '\n') { ++line; column = 1; } else { ++column; }
    }
    std::ostringstream out;
    out << file << ": line " << line << ", column " << column << ": malformed JSON";
    const std::string what = e.what();
    const auto pos = what.find("syntax error");
    if (pos != std::string::npos) out << " (" << what.substr(pos) << ")";
    throw DocumentError(out.str());
  } catch (const nlohmann::json::exception& e) {
    // Valid syntax nlohmann cannot represent, e.g. a number beyond double range ("1e400").
    const std::string what = e.what();
    const auto pos = what.find("] ");
    throw DocumentError(file + ": malformed JSON (" + (pos == std::string::npos ? what : what.substr(pos + 2)) + ")");
  }
}

namespace {
std::string format_number(double x) {
  std::ostringstream out;
  out << x;
  return out.str();
}
}  // namespace

ObjectReader::ObjectReader(const nlohmann::json& json, std::string file, std::string pointer)
    : json_(json), file_(std::move(file)), pointer_(std::move(pointer)) {
  if (!json_.is_object()) fail_at(file_, pointer_, "must be a JSON object");
}

bool ObjectReader::has(const std::string& key) const { return json_.contains(key) && !json_.at(key).is_null(); }

const nlohmann::json& ObjectReader::at(const std::string& key) {
  used_.insert(key);
  if (!json_.contains(key)) fail(key, "is required");
  return json_.at(key);
}

const nlohmann::json& ObjectReader::raw(const std::string& key) { return at(key); }

void ObjectReader::fail(const std::string& key, const std::string& rule) const {
  fail_at(file_, pointer(key), rule);
}

double ObjectReader::number(const std::string& key, double min, double max, bool exclusive_min) {
  const auto& v = at(key);
  if (!v.is_number()) fail(key, "must be a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "must be a finite number");
  if (exclusive_min ? !(x > min) : !(x >= min)) {
    fail(key, std::string("must be ") + (exclusive_min ? "> " : ">= ") + format_number(min) +
                  " (got " + format_number(x) + ")");
  }
  if (x > max) fail(key, "must be <= " + format_number(max) + " (got " + format_number(x) + ")");
  return x;
}

std::optional<double> ObjectReader::optional_number(const std::string& key, double min, double max,
                                                    bool exclusive_min) {
  used_.insert(key);
  if (!has(key)) return std::nullopt;
  return number(key, min, max, exclusive_min);
}

std::int64_t ObjectReader::integer(const std::string& key, std::int64_t min, std::int64_t max) {
  const auto& v = at(key);
  if (!v.is_number()) fail(key, "must be an integer");
  const double x = v.get<double>();
  if (!std::isfinite(x) || std::floor(x) != x) fail(key, "must be an integer (got " + v.dump() + ")");
  if (x < static_cast<double>(min) || x > static_cast<double>(max)) {
    fail(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "] (got " + v.dump() + ")");
  }
  return static_cast<std::int64_t>(x);
}

std::optional<std::int64_t> ObjectReader::optional_integer(const std::string& key, std::int64_t min,
                                                           std::int64_t max) {
  used_.insert(key);
  if (!has(key)) return std::nullopt;
  return integer(key, min, max);
}

bool ObjectReader::boolean(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_boolean()) fail(key, "must be true or false");
  return v.get<bool>();
}

std::optional<bool> ObjectReader::optional_boolean(const std::string& key) {
  used_.insert(key);
  if (!has(key)) return std::nullopt;
  return boolean(key);
}

std::string ObjectReader::string(const std::string& key) {
  const auto& v = at(key);
  if (!v.is_string()) fail(key, "must be a string");
  std::string s = v.get<std::string>();
  // Names and free text travel into reports, comments and generated scripts: a line break or any
  // other control character there could end a comment and start a command.
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char what[96];
      std::snprintf(what, sizeof what, "must be single-line printable text (control character 0x%02x at character %zu)", c, i + 1);
      fail(key, what);
    }
  }
  return s;
}

std::optional<std::string> ObjectReader::optional_string(const std::string& key) {
  used_.insert(key);
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::string ObjectReader::one_of(const std::string& key, std::initializer_list<const char*> choices) {
  const std::string s = string(key);
  std::string list;
  for (const char* c : choices) {
    if (s == c) return s;
    list += (list.empty() ? "" : " | ") + std::string(c);
  }
  fail(key, "must be one of " + list + " (got \"" + s + "\")");
}

std::optional<std::string> ObjectReader::optional_one_of(const std::string& key,
                                                         std::initializer_list<const char*> choices) {
  used_.insert(key);
  if (!has(key)) return std::nullopt;
  return one_of(key, choices);
}

ObjectReader ObjectReader::object(const std::string& key) {
  return ObjectReader(at(key), file_, pointer(key));
}

void ObjectReader::expect_schema(const std::string& expected) {
  const std::string got = string("schema");
  if (got != expected) fail("schema", "must be \"" + expected + "\" (got \"" + got + "\")");
}

void ObjectReader::finish() const {
  for (auto it = json_.begin(); it != json_.end(); ++it) {
    if (used_.count(it.key()) == 0) fail(it.key(), "unknown key");
  }
}

std::vector<std::vector<double>> read_number_rows(ObjectReader& r, const std::string& key, std::size_t width, std::size_t key_width,
                                                  const char* key_names) {
  if (!r.has(key)) r.fail(key, "missing: a table needs rows");
  const auto& rows = r.raw(key);
  if (!rows.is_array() || rows.empty()) r.fail(key, "must be a non-empty array of rows");
  std::vector<std::vector<double>> out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string at = key + "/" + std::to_string(i);
    const auto& row = rows[i];
    if (!row.is_array() || row.size() != width) r.fail(at, "must be an array of " + std::to_string(width) + " numbers");
    std::vector<double> values;
    for (std::size_t j = 0; j < width; ++j) {
      if (!row[j].is_number()) r.fail(at + "/" + std::to_string(j), "must be a number");
      const double v = row[j].get<double>();
      if (!(std::isfinite(v) && v > 0)) {
        char text[64];
        std::snprintf(text, sizeof text, "%g", v);
        r.fail(at + "/" + std::to_string(j), std::string("must be a finite number > 0 (got ") + text + ")");
      }
      values.push_back(v);
    }
    if (!out.empty()) {
      const auto& prev = out.back();
      if (!std::lexicographical_compare(prev.begin(), prev.begin() + static_cast<long>(key_width), values.begin(),
                                        values.begin() + static_cast<long>(key_width))) {
        r.fail(at, std::string("rows must be in strictly increasing (") + key_names + ") order; row " + std::to_string(i) +
                       " does not come after row " + std::to_string(i - 1));
      }
    }
    out.push_back(std::move(values));
  }
  return out;
}

void expect_columns(ObjectReader& r, std::initializer_list<const char*> names) {
  if (!r.has("columns")) r.fail("columns", "missing: the table must name its columns");
  const auto& c = r.raw("columns");
  std::string expected;
  for (const char* n : names) expected += (expected.empty() ? "" : ", ") + std::string(n);
  bool ok = c.is_array() && c.size() == names.size();
  std::size_t i = 0;
  for (const char* n : names) {
    if (!ok) break;
    ok = c[i].is_string() && c[i].get<std::string>() == n;
    ++i;
  }
  if (!ok) r.fail("columns", "must be [" + expected + "]");
}

}  // namespace trainplan::costmodel::detail
