#include "trainplan/gui/planning_session.hpp"

#include <algorithm>

#include <QCoreApplication>
#include <QDeadlineTimer>
#include <QThread>
#include <QtConcurrent/QtConcurrentRun>

namespace trainplan::gui {

namespace cm = trainplan::costmodel;
namespace pl = trainplan::planner;

namespace {
constexpr int kRankedPlans = 25;  // ranked plans the table lists (the alternatives come on top)
}  // namespace

struct PlanningSession::SearchOutcome {
  cm::PlanRequest request;
  pl::Objective objective;
  cm::Result<pl::SearchResult> result;
};

struct PlanningSession::ScalingOutcome {
  std::vector<ScalingPoint> points;
};

PlanningSession::PlanningSession(QObject* parent) : QObject(parent) {
  // Two threads: the newest search and the scaling curve (or a stopping, stale search).
  pool_.setMaxThreadCount(2);
}

PlanningSession::~PlanningSession() {
  stop_running();
  pool_.waitForDone();
}

void PlanningSession::stop_running() {
  if (stop_) stop_->store(true);
}

void PlanningSession::forget_finished() {
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const QFuture<void>& f) { return f.isFinished(); }),
                 running_.end());
}

bool PlanningSession::submit(const RequestForm& form, pl::Objective objective) {
  BuiltRequest built = build_request(form);
  input_errors_ = std::move(built.errors);
  emit inputErrorsChanged();
  if (!built.request) return false;
  memory_headroom_ = built.memory_headroom;

  ++generation_;
  stop_running();
  stop_ = std::make_shared<std::atomic<bool>>(false);
  forget_finished();
  searching_ = true;
  scaling_pending_ = false;
  emit searchStarted();

  const quint64 generation = generation_;
  const auto stop = stop_;
  running_.push_back(QtConcurrent::run(&pool_, [this, generation, stop, request = std::move(*built.request), objective,
                                                 headroom = built.memory_headroom] {
    pl::SearchOptions options;
    options.objective = objective;
    options.memory_headroom = headroom;
    options.top = kRankedPlans;
    options.threads = std::max(1, QThread::idealThreadCount());  // the same result as one thread, sooner
    // Progress in steps of 5% at most: every report wakes the UI thread, which shares the cores
    // with the search. (The planner calls this under its lock, one call at a time.)
    options.progress = [this, generation, reported = -1.0](double fraction) mutable {
      if (fraction < reported + 0.05 && fraction < 1.0) return;
      reported = fraction;
      QMetaObject::invokeMethod(
          this, [this, generation, fraction] { if (generation == generation_) emit progressChanged(fraction); }, Qt::QueuedConnection);
    };
    options.should_stop = [stop] { return stop->load(); };
    auto outcome = std::make_shared<SearchOutcome>(SearchOutcome{request, objective, pl::search(request, options)});
    QMetaObject::invokeMethod(this, [this, generation, outcome] { finish_search(generation, outcome); }, Qt::QueuedConnection);
  }));
  return true;
}

void PlanningSession::finish_search(quint64 generation, const std::shared_ptr<SearchOutcome>& outcome) {
  if (generation != generation_) return;  // a newer input is being searched
  searching_ = false;
  if (!outcome->result.ok()) {
    search_error_ = QString::fromStdString(outcome->result.error().message);
    emit searchFailed(search_error_);
    return;
  }
  search_error_.clear();
  request_ = outcome->request;
  objective_ = outcome->objective;
  result_ = std::move(outcome->result).value();
  emit resultsChanged();
  if (!result_->ranked.empty()) select_plan(result_->ranked.front().plan);
  else if (!result_->alternatives.empty()) select_plan(result_->alternatives.front().candidate.plan);
  start_scaling(generation);
}

std::vector<int> PlanningSession::scaling_gpu_counts(int gpus) {
  std::vector<int> counts;
  for (int shift = 3; shift >= 1; --shift) {
    if (gpus % (1 << shift) == 0) counts.push_back(gpus >> shift);
  }
  counts.push_back(gpus);
  for (int shift = 1; shift <= 3; ++shift) {
    if (static_cast<long long>(gpus) << shift <= (1 << 24)) counts.push_back(gpus << shift);
  }
  return counts;
}

void PlanningSession::start_scaling(quint64 generation) {
  if (!request_ || !result_) return;
  scaling_pending_ = true;
  cm::PlanRequest base = *request_;
  base.parallel.dp.reset();  // the data-parallel degree follows the GPU count
  std::optional<pl::Candidate> here;
  if (!result_->ranked.empty()) here = result_->ranked.front();
  const auto stop = stop_;
  const pl::Objective objective = objective_;
  forget_finished();
  running_.push_back(QtConcurrent::run(&pool_, [this, generation, stop, base = std::move(base), here = std::move(here), objective,
                                                 headroom = memory_headroom_] {
    auto outcome = std::make_shared<ScalingOutcome>();
    for (int gpus : scaling_gpu_counts(base.gpus)) {
      if (stop->load()) return;
      ScalingPoint point{gpus, std::nullopt};
      if (gpus == base.gpus) {
        point.best = here;
      } else {
        cm::PlanRequest request = base;
        request.gpus = gpus;
        pl::SearchOptions options;
        options.objective = objective;
        options.top = 1;
        options.memory_headroom = headroom;
        options.threads = std::max(1, QThread::idealThreadCount());  // a newer search stops this one at once
        options.should_stop = [stop] { return stop->load(); };
        if (cm::validate_request(request).ok()) {
          auto result = pl::search(request, options);
          if (result.ok() && !result->ranked.empty()) point.best = result->ranked.front();
        }
      }
      outcome->points.push_back(std::move(point));
    }
    QMetaObject::invokeMethod(this, [this, generation, outcome] { finish_scaling(generation, outcome); }, Qt::QueuedConnection);
  }));
}

void PlanningSession::finish_scaling(quint64 generation, const std::shared_ptr<ScalingOutcome>& outcome) {
  if (generation != generation_) return;
  scaling_pending_ = false;
  scaling_ = std::move(outcome->points);
  emit scalingChanged();
}

bool PlanningSession::select_plan(const cm::Plan& plan) {
  cm::EstimateOptions estimate_options;
  estimate_options.memory_headroom = memory_headroom_;
  auto candidate = pl::evaluate(plan, estimate_options);
  if (!candidate) {
    selection_error_ = QString::fromStdString(candidate.error().message);
    emit selectionRejected(selection_error_);
    return false;
  }
  auto simulation = cm::simulate_pipeline(candidate->estimate.pipeline);
  if (!simulation) {
    selection_error_ = QString::fromStdString(simulation.error().message);
    emit selectionRejected(selection_error_);
    return false;
  }
  selection_error_.clear();
  selected_ = std::move(candidate).value();
  schedule_ = std::move(simulation).value();
  emit selectionChanged();
  return true;
}

cm::Result<bool> PlanningSession::load_measurement(const std::string& path) {
  auto document = pl::load_measurement_file(path);
  if (!document) return document.error();
  measurement_ = std::move(document).value();
  emit measurementChanged();
  return true;
}

void PlanningSession::clear_measurement() {
  measurement_.reset();
  emit measurementChanged();
}

std::optional<pl::Comparison> PlanningSession::comparison() const {
  if (!selected_ || !measurement_) return std::nullopt;
  return pl::compare(pl::predict(selected_->plan, "selected plan"), *measurement_);
}

bool PlanningSession::wait_idle(int timeout_ms) {
  QDeadlineTimer deadline(timeout_ms);
  while ((searching_ || scaling_pending_) && !deadline.hasExpired()) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 5);
    if (searching_ || scaling_pending_) QThread::msleep(1);
  }
  return !searching_ && !scaling_pending_;
}

}  // namespace trainplan::gui
