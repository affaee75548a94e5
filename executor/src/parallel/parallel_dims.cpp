// Process-group layout (see parallel_dims.hpp).

#include "parallel_dims.hpp"

namespace trainplan::executor {

std::string ParallelDims::mismatch(int world_size) const {
  if (this->world_size() == world_size) return "";
  return "tp(" + std::to_string(tp) + ") * cp(" + std::to_string(cp) + ") * pp(" + std::to_string(pp) + ") * dp(" +
         std::to_string(dp) + ") = " + std::to_string(this->world_size()) + " != world size (" + std::to_string(world_size) + ")";
}

RankCoords rank_coords(const ParallelDims& d, int rank) {
  RankCoords c;
  c.tp = rank % d.tp;
  rank /= d.tp;
  c.cp = rank % d.cp;
  rank /= d.cp;
  c.pp = rank % d.pp;
  c.dp = rank / d.pp;
  return c;
}

int rank_of(const ParallelDims& d, const RankCoords& c) { return ((c.dp * d.pp + c.pp) * d.cp + c.cp) * d.tp + c.tp; }

ProcessGroups make_process_groups(const ParallelDims& dims, Communicator& world) {
  ProcessGroups g;
  g.dims = dims;
  g.world = &world;
  const int rank = world.rank();
  const RankCoords c = rank_coords(dims, rank);
  g.coords = c;
  // Colour = the coordinates the group shares; key = the coordinate that varies.
  const auto counted = [&](int color, int key, const char* name, std::shared_ptr<std::atomic<double>>& sent) {
    sent = std::make_shared<std::atomic<double>>(0.0);
    return make_counting_communicator(world.split(color, key, name), sent);
  };
  g.tp = counted((c.dp * dims.pp + c.pp) * dims.cp + c.cp, c.tp, "tp", g.bytes_sent.tp);
  g.cp = counted((c.dp * dims.pp + c.pp) * dims.tp + c.tp, c.cp, "cp", g.bytes_sent.cp);
  g.pp = counted((c.dp * dims.cp + c.cp) * dims.tp + c.tp, c.pp, "pp", g.bytes_sent.pp);
  g.dp = counted(c.pp * dims.tp + c.tp, c.dp * dims.cp + c.cp, "dp", g.bytes_sent.dp);
  const int ep = dims.ep;
  g.ep = counted((((c.dp / ep) * dims.pp + c.pp) * dims.cp + c.cp) * dims.tp + c.tp, c.dp % ep, "ep", g.bytes_sent.ep);
  g.edp = make_counting_communicator(world.split(((c.dp % ep) * dims.pp + c.pp) * dims.tp + c.tp, (c.dp / ep) * dims.cp + c.cp, "edp"),
                                     g.bytes_sent.dp);
  const bool end_stage = dims.pp > 1 && (c.pp == 0 || c.pp == dims.pp - 1);
  const int pipeline = (c.dp * dims.cp + c.cp) * dims.tp + c.tp;
  g.tied = world.split(end_stage ? pipeline : world.size() + rank, c.pp, end_stage ? "tied-embedding" : "self");
  return g;
}

}  // namespace trainplan::executor
