#include "trainplan/costmodel/collectives.hpp"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "json_reader.hpp"

namespace trainplan::costmodel {

namespace {

struct Kind {
  const char* name;
  std::vector<BusBandwidthSample> MeasuredCollectives::*rows;
};
constexpr Kind kKinds[] = {
    {"all_reduce", &MeasuredCollectives::all_reduce},
    {"all_gather", &MeasuredCollectives::all_gather},
    {"reduce_scatter", &MeasuredCollectives::reduce_scatter},
};

}  // namespace

std::shared_ptr<const MeasuredCollectives> read_measured_collectives(const nlohmann::json& json, const std::string& file,
                                                                     const std::string& pointer, int max_ranks) {
  detail::ObjectReader r(json, file, pointer);
  auto table = std::make_shared<MeasuredCollectives>();
  table->source = r.optional_string("source").value_or("");
  table->ranks = static_cast<int>(r.integer("ranks", 1, 1 << 20));
  if (table->ranks < 2 || table->ranks > max_ranks) {
    r.fail("ranks", "must be from 2 to node/gpus_per_node (" + std::to_string(max_ranks) + "): the table describes collectives inside one node (got " +
                        std::to_string(table->ranks) + ")");
  }
  detail::expect_columns(r, {"bytes", "bus_gb_per_s"});
  detail::ObjectReader c = r.object("collectives");
  bool any = false;
  for (const Kind& kind : kKinds) {
    if (!c.has(kind.name)) continue;
    for (const auto& row : detail::read_number_rows(c, kind.name, 2, 1, "bytes")) {
      ((*table).*kind.rows).push_back({row[0], row[1] * 1e9});
    }
    any = true;
  }
  if (!any) r.fail("collectives", "must hold at least one of all_reduce, all_gather, reduce_scatter");
  c.finish();
  r.finish();
  return table;
}

nlohmann::json measured_collectives_to_json(const MeasuredCollectives& table) {
  nlohmann::json collectives = nlohmann::json::object();
  for (const Kind& kind : kKinds) {
    const auto& rows = table.*kind.rows;
    if (rows.empty()) continue;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& s : rows) list.push_back({s.bytes, s.bus_bandwidth / 1e9});
    collectives[kind.name] = list;
  }
  nlohmann::json j = {{"ranks", table.ranks}, {"columns", {"bytes", "bus_gb_per_s"}}, {"collectives", collectives}};
  if (!table.source.empty()) j["source"] = table.source;
  return j;
}

double interpolate_bus_bandwidth(const std::vector<BusBandwidthSample>& samples, double bytes) {
  if (bytes <= samples.front().bytes) return samples.front().bus_bandwidth;
  if (bytes >= samples.back().bytes) return samples.back().bus_bandwidth;
  const auto hi = std::upper_bound(samples.begin(), samples.end(), bytes,
                                   [](double b, const BusBandwidthSample& s) { return b < s.bytes; });
  const auto lo = hi - 1;
  const double f = std::log(bytes / lo->bytes) / std::log(hi->bytes / lo->bytes);
  return std::exp(std::log(lo->bus_bandwidth) + f * std::log(hi->bus_bandwidth / lo->bus_bandwidth));
}

}  // namespace trainplan::costmodel
