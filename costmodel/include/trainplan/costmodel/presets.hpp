#pragma once
// Built-in presets: the model documents in samples/models/ and the hardware profiles in
// hwprofiles/, compiled into the library (cmake/EmbedPresets.cmake), plus name resolution:
// a preset name, a short alias ("70b"), or a path to a JSON file.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainplan/costmodel/hardware.hpp"
#include "trainplan/costmodel/model.hpp"
#include "trainplan/costmodel/result.hpp"

namespace trainplan::costmodel {

struct EmbeddedDocument {
  const char* name;  // file stem, e.g. "llama3-70b"
  const char* path;  // source path at build time (for messages)
  const char* text;  // the JSON text
};

const std::vector<EmbeddedDocument>& embedded_models();
const std::vector<EmbeddedDocument>& embedded_hwprofiles();

// The default cluster when none is given.
inline constexpr const char* kDefaultCluster = "dgx-h100";

// Preset names, sorted as stored.
[[nodiscard]] std::vector<std::string> model_preset_names();
[[nodiscard]] std::vector<std::string> hwprofile_preset_names();

// Short aliases: "70b" -> "llama3-70b", "405b" -> "llama3-405b", "8b" -> "llama3-8b", "175b" -> "gpt3-175b".
[[nodiscard]] std::string resolve_model_alias(const std::string& name);

// Finds a model by preset name, alias, or path to a `trainplan/model/v1` file. The error lists
// the presets when the name is unknown.
[[nodiscard]] Result<ModelSpec> find_model(const std::string& name_or_path);
[[nodiscard]] Result<HardwareProfile> find_hwprofile(const std::string& name_or_path);

// Reads a whole file; the error names the path ("x.json: cannot open file", "dir: is a
// directory, not a file", "x: larger than 1024 MiB"). kMaxTextFileBytes is the most it reads,
// 1 GiB: a measurement with a full trace is tens of MB, and an endless stream (/dev/zero) stops.
inline constexpr std::size_t kMaxTextFileBytes = std::size_t{1} << 30;
[[nodiscard]] Result<std::string> read_text_file(const std::string& path);

// The message when writing `output` (given as `output_flag`) would replace one of `inputs` (the
// same file or directory, however named: links and relative paths too), else empty; each input
// is a pair (what it is, for the message; its path). Empty when the output does not exist yet.
// "--out p.json: is the plan file p.json; writing there would replace it (give another path)".
[[nodiscard]] std::string overwrite_conflict(const std::string& output_flag, const std::string& output,
                                             const std::vector<std::pair<std::string, std::string>>& inputs);

// Parses JSON text; a syntax error names `file`, the line and the column
// ("m.json: line 3, column 7: malformed JSON (...)"), and a key repeated in one object is an
// error naming its JSON pointer ("m.json: /parallel/tp: duplicate key \"tp\" ..."). Every JSON
// document trainplan reads (planner, executor, GUI) goes through this or the costmodel loaders.
[[nodiscard]] Result<nlohmann::json> parse_json_text(const std::string& text, const std::string& file);

}  // namespace trainplan::costmodel
