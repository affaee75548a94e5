// render_tune: the tune's report for people.

#include <cmath>
#include <sstream>

#include "../text_table.hpp"
#include "trainplan/planner/calibrate.hpp"
#include "trainplan/planner/tune.hpp"

namespace trainplan::planner {

using detail::fmt;
using detail::Row;
using detail::table;
using detail::wrap_text;

namespace {

std::string seconds_text(const std::optional<double>& s) { return s ? fmt("%.4g", *s) : "-"; }

std::string error_text(const std::optional<double>& predicted, const std::optional<double>& measured) {
  if (!predicted || !measured || !(*measured > 0)) return "-";
  return fmt("%+.1f%%", 100 * (*predicted / *measured - 1));
}

}  // namespace

std::string render_tune(const TuneResult& r) {
  std::ostringstream out;
  if (r.dry_run) {
    out << "planner tune --dry-run: the runs the tune would start, in order (nothing was run; the plans are written under " << r.out_dir
        << "/candidates)\n\n"
        << r.dry_run_text;
    return out.str();
  }
  out << "\nTune: " << r.candidates.size() << " candidate(s) on " << r.base.name << (r.interrupted ? " (interrupted)" : "") << "\n\n";
  std::vector<Row> rows;
  for (const auto& c : r.candidates) {
    const auto& p = c.plan.parallel;
    rows.push_back(Row{{std::to_string(c.number) + (c.number == r.chosen ? " *" : ""), c.round == 0 ? "top" : fmt("cal %d", c.round), c.layout,
                        std::to_string(p.micro_batch) + (p.virtual_stages > 1 ? fmt(" v%d", p.virtual_stages) : ""), run_status_name(c.status),
                        fmt("%.4g", c.predicted_before), seconds_text(c.measured), error_text(c.predicted_before, c.measured),
                        seconds_text(c.predicted_after), error_text(c.predicted_after, c.measured)}});
  }
  out << table({"#", "from", "layout", "MB", "status", "predicted s", "measured s", "error", "after s", "error after"}, rows, false,
               {true, false, false, true, false, true, true, true, true, true})
      << "\n";
  out << "  predicted s: the step on the profile the tune started from; after s: on the calibrated profile; error = predicted / measured - 1;\n"
      << "  \"top\": from the search's ranking of distinct layouts, \"cal N\": ranked first after the N-th calibration; * the choice.\n\n";
  for (const auto& c : r.candidates) {
    if (c.status != RunStatus::kMeasured && !c.detail.empty()) out << wrap_text(fmt("[%d] %s: %s", c.number, run_status_name(c.status), c.detail.c_str()), 110, "  ");
  }
  if (!r.resumed.empty()) {
    out << "\n  Resumed: ended before and not run again (a measured one's missing runs excepted):\n";
    for (const auto& line : r.resumed) out << "    " << line << "\n";
  }
  if (r.calibrated) {
    const auto& k = r.calibrated->gpu.calibration;
    out << "\n" << wrap_text("Calibrated " + r.calibrated->name + ": " + calibration_scales_text(k), 110, "");
    for (const auto& note : r.calibration_notes) out << wrap_text(note, 110, "  ");
  }
  if (r.interrupted) {
    out << "\nInterrupted: what ended is in " << r.out_dir << "/tune.json; the same command with --resume goes on and re-runs nothing that ended.\n";
    return out.str();
  }
  out << "\n";
  if (r.chosen > 0) {
    const auto& c = r.candidates[static_cast<std::size_t>(r.chosen - 1)];
    out << "Choice: [" << c.number << "] " << c.layout << ", micro-batch " << c.plan.parallel.micro_batch << "\n";
    out << wrap_text("Why: " + r.why + ".", 110, "  ");
  } else {
    out << wrap_text("No choice: " + r.why + ".", 110, "");
  }
  out << "\nWritten to " << r.out_dir << ": tune.json (every candidate, resumable with --resume)";
  if (!r.profile_path.empty()) out << ", profile.json (the calibrated profile)";
  if (!r.final_plan.empty()) out << ", plan.json (the choice, on the calibrated profile)";
  out << ", candidates/NN/ (plan, log, measurement)\n";
  if (!r.final_plan.empty()) out << "  planner evaluate " << r.final_plan << "   # its full breakdown\n";
  return out.str();
}

}  // namespace trainplan::planner
