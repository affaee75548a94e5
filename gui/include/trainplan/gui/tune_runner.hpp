#pragma once
// TuneRunner: `planner tune` (planner/tune.hpp) on a worker thread for the app's "Measure the top
// plans on this machine" action. The tune's progress lines and each change of its candidates reach
// the GUI thread as queued signals; the candidates are read with candidates() under a lock.

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <QObject>
#include <QString>

#include "trainplan/costmodel/plan.hpp"
#include "trainplan/planner/tune.hpp"

namespace trainplan::gui {

class TuneRunner : public QObject {
  Q_OBJECT
 public:
  explicit TuneRunner(QObject* parent = nullptr);
  ~TuneRunner() override;  // stops a running tune (as SIGTERM would) and waits for it

  // Starts the tune. False when one runs already. options.progress and options.updated are
  // replaced by the runner's own.
  bool start(const costmodel::PlanRequest& request, planner::TuneOptions options);
  [[nodiscard]] bool running() const { return running_.load(); }
  // The tune's candidates as last written.
  [[nodiscard]] std::vector<planner::TuneCandidate> candidates() const;

 signals:
  void progress(const QString& line);
  void candidatesChanged();
  // The tune's report (or the error that stopped it); ok: it ended with a choice.
  void finished(const QString& report, bool ok);

 private:
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> stop_{false};  // TuneOptions::stop
  mutable std::mutex mutex_;
  std::vector<planner::TuneCandidate> candidates_;
};

}  // namespace trainplan::gui
