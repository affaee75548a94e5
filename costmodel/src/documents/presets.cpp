#include "trainplan/costmodel/presets.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "trainplan/costmodel/hf_config.hpp"

namespace trainplan::costmodel {

namespace {

std::vector<std::string> names_of(const std::vector<EmbeddedDocument>& docs) {
  std::vector<std::string> names;
  for (const auto& d : docs) names.emplace_back(d.name);
  return names;
}

bool looks_like_path(const std::string& s) {
  std::error_code ec;
  return s.find('/') != std::string::npos || (s.size() > 5 && s.substr(s.size() - 5) == ".json") ||
         std::filesystem::is_directory(s, ec);
}

// `folder_file`: a folder given as the document is read through this file in it (a Hugging Face
// checkpoint folder through its config.json); empty: a folder is an error.
template <typename T, typename Parse>
Result<T> find_document(const std::string& name, const std::vector<EmbeddedDocument>& docs, const char* kind,
                        Parse parse, const char* folder_file = "") {
  for (const auto& d : docs) {
    if (name == d.name) return parse(d.text, std::string(d.name) + ".json (built-in)");
  }
  if (looks_like_path(name)) {
    std::error_code ec;
    std::string file = name;
    if (*folder_file != '\0' && std::filesystem::is_directory(name, ec)) {
      file = (std::filesystem::path(name) / folder_file).string();
      if (!std::filesystem::exists(file, ec)) {
        return Error{name + ": is a directory, not a file (nor a checkpoint folder: it has no " + folder_file + ")"};
      }
    }
    auto text = read_text_file(file);
    if (!text) return text.error();
    return parse(*text, file);
  }
  std::string list;
  for (const auto& d : docs) list += (list.empty() ? "" : ", ") + std::string(d.name);
  return Error{std::string("unknown ") + kind + " \"" + name + "\" (presets: " + list +
               "; or give a path to a .json file" + (std::string(kind) == "model" ? ", a Hugging Face config.json or its folder" : "") + ")"};
}

}  // namespace

std::vector<std::string> model_preset_names() { return names_of(embedded_models()); }
std::vector<std::string> hwprofile_preset_names() { return names_of(embedded_hwprofiles()); }

std::string resolve_model_alias(const std::string& name) {
  static const std::map<std::string, std::string> aliases = {
      {"8b", "llama3-8b"},   {"70b", "llama3-70b"}, {"405b", "llama3-405b"}, {"175b", "gpt3-175b"},
      {"7b", "llama2-7b"},   {"13b", "llama2-13b"}, {"1.1b", "tinyllama-1.1b"}, {"1.5b", "gpt2-1.5b"},
      {"8x7b", "mixtral-8x7b"}, {"mixtral", "mixtral-8x7b"}, {"tinyllama", "tinyllama-1.1b"},
  };
  const auto it = aliases.find(name);
  return it == aliases.end() ? name : it->second;
}

Result<ModelSpec> find_model(const std::string& name_or_path) {
  return find_document<ModelSpec>(resolve_model_alias(name_or_path), embedded_models(), "model",
                                  [](const std::string& text, const std::string& file) {
                                    return parse_model_or_hf_config_text(text, file);
                                  },
                                  "config.json");
}

Result<HardwareProfile> find_hwprofile(const std::string& name_or_path) {
  return find_document<HardwareProfile>(name_or_path, embedded_hwprofiles(), "cluster",
                                        [](const std::string& text, const std::string& file) {
                                          return parse_hwprofile_text(text, file);
                                        });
}

Result<std::string> read_text_file(const std::string& path) {
  std::error_code ec;
  // An ifstream opens a directory on Linux and then fails to read it: say what it is instead.
  if (std::filesystem::is_directory(path, ec)) return Error{path + ": is a directory, not a file"};
  const auto too_large = [&] {
    return Error{path + ": larger than " + std::to_string(kMaxTextFileBytes >> 20) + " MiB, more than any document, table or log this tool reads"};
  };
  if (std::filesystem::is_regular_file(path, ec) && std::filesystem::file_size(path, ec) > kMaxTextFileBytes && !ec) return too_large();
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{path + ": cannot open file (" + std::strerror(errno) + ")"};
  // Read in pieces, so that an endless stream (/dev/zero, a pipe) stops at the limit.
  std::string text;
  std::vector<char> piece(1 << 20);
  while (in.read(piece.data(), static_cast<std::streamsize>(piece.size())) || in.gcount() > 0) {
    text.append(piece.data(), static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxTextFileBytes) return too_large();
  }
  if (in.bad()) return Error{path + ": read error"};
  return text;
}

std::string overwrite_conflict(const std::string& output_flag, const std::string& output,
                               const std::vector<std::pair<std::string, std::string>>& inputs) {
  struct stat out {};
  if (output.empty() || ::stat(output.c_str(), &out) != 0) return "";
  for (const auto& [what, path] : inputs) {
    struct stat in {};
    if (path.empty() || ::stat(path.c_str(), &in) != 0) continue;
    if (in.st_dev == out.st_dev && in.st_ino == out.st_ino) {
      return output_flag + " " + output + ": is the " + what + " " + path + "; writing there would replace it (give another path)";
    }
  }
  return "";
}

Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& file) {
  try {
    return detail::parse_json(text, file);
  } catch (const detail::DocumentError& e) {
    return Error{e.what()};
  }
}

}  // namespace trainplan::costmodel
