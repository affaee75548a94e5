#pragma once
// PlanningSession: the state behind the window, and the only place searches run. It turns the
// form into a request (build_request), searches it off the UI thread (planner::search on a thread
// pool, with progress), keeps the last good result when the newest input is wrong, and holds the
// selected plan (chosen in the table, or edited knob by knob: "what if"), its estimate, the
// pipeline schedule simulated from it, a loaded measurement and the scaling curve.
//
// Searches use every core (SearchOptions::threads; the same result as one thread); the scaling
// curve is searched after the result, and stops as soon as a newer input comes.
//
// Newest input wins: every submit() starts a new generation; a running search of an older
// generation is asked to stop (SearchOptions::should_stop) and whatever it returns is dropped.

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <QFuture>
#include <QObject>
#include <QThreadPool>

#include "trainplan/costmodel/schedule.hpp"
#include "trainplan/gui/request_form.hpp"
#include "trainplan/gui/table_models.hpp"
#include "trainplan/planner/compare.hpp"
#include "trainplan/planner/measurement.hpp"
#include "trainplan/planner/search.hpp"

namespace trainplan::gui {

class PlanningSession : public QObject {
  Q_OBJECT
 public:
  explicit PlanningSession(QObject* parent = nullptr);
  // Stops running searches and waits for them.
  ~PlanningSession() override;

  // Reads the form; when it is valid starts a search (returns true), else records the errors
  // (input_errors(), inputErrorsChanged) and keeps the last good result (returns false).
  bool submit(const RequestForm& form, planner::Objective objective);

  // The request and result of the newest search that succeeded; absent before the first.
  [[nodiscard]] const std::optional<costmodel::PlanRequest>& request() const { return request_; }
  [[nodiscard]] const std::optional<planner::SearchResult>& result() const { return result_; }
  [[nodiscard]] planner::Objective objective() const { return objective_; }
  // The memory headroom (fraction of HBM) of the newest request: plans within it are tight.
  [[nodiscard]] double memory_headroom() const { return memory_headroom_; }
  // What was wrong with the newest input (empty when it was good).
  [[nodiscard]] const std::vector<FieldError>& input_errors() const { return input_errors_; }
  // The error of the newest search, when the request was impossible ("no valid plan: ...").
  [[nodiscard]] const QString& search_error() const { return search_error_; }
  [[nodiscard]] bool searching() const { return searching_; }
  [[nodiscard]] quint64 generation() const { return generation_; }

  // Makes `plan` the selected plan: validate_plan, then estimate and simulate its pipeline.
  // An invalid plan leaves the selection as it was and sets selection_error() (returns false).
  bool select_plan(const costmodel::Plan& plan);
  [[nodiscard]] const std::optional<planner::Candidate>& selected() const { return selected_; }
  [[nodiscard]] const QString& selection_error() const { return selection_error_; }
  // The pipeline schedule of the selected plan (costmodel::simulate_pipeline of its estimate).
  [[nodiscard]] const std::optional<costmodel::ScheduleSimulation>& schedule() const { return schedule_; }

  // Loads an executor measurement (planner::load_measurement_file); on error keeps the one
  // loaded before and returns the message.
  costmodel::Result<bool> load_measurement(const std::string& path);
  void clear_measurement();
  [[nodiscard]] const std::optional<planner::PerformanceDocument>& measurement() const { return measurement_; }
  // planner::compare of the selected plan's prediction with the measurement, when both exist.
  [[nodiscard]] std::optional<planner::Comparison> comparison() const;

  // The best plan for each GPU count around the request's (1/8x to 8x, powers of two), searched
  // after the main result with the same objective and batch; empty until then.
  [[nodiscard]] const std::vector<ScalingPoint>& scaling() const { return scaling_; }
  [[nodiscard]] bool scaling_pending() const { return scaling_pending_; }

  // The GPU counts scaling() covers for a request on `gpus` GPUs.
  [[nodiscard]] static std::vector<int> scaling_gpu_counts(int gpus);

  // Waits (processing events) until no search is running, at most `timeout_ms`; true if idle.
  bool wait_idle(int timeout_ms);

 signals:
  void searchStarted();
  void progressChanged(double fraction);
  // A new search result is in result(); the selection was set to its best plan.
  void resultsChanged();
  void searchFailed(const QString& message);
  void inputErrorsChanged();
  void selectionChanged();
  void selectionRejected(const QString& message);
  void measurementChanged();
  void scalingChanged();

 private:
  struct SearchOutcome;
  struct ScalingOutcome;
  void finish_search(quint64 generation, const std::shared_ptr<SearchOutcome>& outcome);
  void finish_scaling(quint64 generation, const std::shared_ptr<ScalingOutcome>& outcome);
  void start_scaling(quint64 generation);
  void stop_running();
  void forget_finished();

  QThreadPool pool_;
  std::vector<QFuture<void>> running_;
  std::shared_ptr<std::atomic<bool>> stop_;  // the newest generation's stop flag
  quint64 generation_ = 0;
  bool searching_ = false;
  bool scaling_pending_ = false;

  std::optional<costmodel::PlanRequest> request_;
  std::optional<planner::SearchResult> result_;
  planner::Objective objective_ = planner::Objective::kThroughput;
  double memory_headroom_ = costmodel::kDefaultMemoryHeadroom;  // of the newest request
  std::vector<FieldError> input_errors_;
  QString search_error_;

  std::optional<planner::Candidate> selected_;
  std::optional<costmodel::ScheduleSimulation> schedule_;
  QString selection_error_;
  std::optional<planner::PerformanceDocument> measurement_;
  std::vector<ScalingPoint> scaling_;
};

}  // namespace trainplan::gui
