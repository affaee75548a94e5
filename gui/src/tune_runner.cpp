#include "trainplan/gui/tune_runner.hpp"

namespace trainplan::gui {

TuneRunner::TuneRunner(QObject* parent) : QObject(parent) {}

TuneRunner::~TuneRunner() {
  stop_.store(true);  // the running job is ended, the tune's state kept
  if (thread_.joinable()) thread_.join();
}

bool TuneRunner::start(const costmodel::PlanRequest& request, planner::TuneOptions options) {
  if (running_.exchange(true)) return false;
  if (thread_.joinable()) thread_.join();
  options.progress = [this](const std::string& line) { emit progress(QString::fromStdString(line)); };
  options.status_line = nullptr;
  stop_.store(false);
  options.stop = &stop_;
  options.updated = [this](const std::vector<planner::TuneCandidate>& candidates) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      candidates_ = candidates;
    }
    emit candidatesChanged();
  };
  thread_ = std::thread([this, request, options] {
    auto result = planner::tune(request, options);
    QString report;
    bool ok = false;
    if (result) {
      report = QString::fromStdString(planner::render_tune(*result));
      ok = result->chosen > 0 && !result->interrupted;
    } else {
      report = QString::fromStdString(result.error().message);
    }
    running_.store(false);
    emit finished(report, ok);
  });
  return true;
}

std::vector<planner::TuneCandidate> TuneRunner::candidates() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return candidates_;
}

}  // namespace trainplan::gui
