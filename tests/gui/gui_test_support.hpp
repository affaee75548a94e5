#pragma once
// Helpers for the GUI tests (offscreen Qt): waits on the event loop that always have a timeout,
// a capture of Qt's warnings (QAbstractItemModelTester reports through them), and paths.

#include <functional>
#include <string>

#include <QCoreApplication>
#include <QElapsedTimer>
#include <QStringList>
#include <QThread>

namespace trainplan::testing {

inline std::string gui_data_path(const std::string& name) { return std::string(TRAINPLAN_TEST_DATA_DIR) + "/" + name; }

// Processes events until `done()` or `timeout_ms` passes; returns done().
inline bool wait_until(const std::function<bool()>& done, int timeout_ms = 20000) {
  QElapsedTimer clock;
  clock.start();
  while (!done() && clock.elapsed() < timeout_ms) {
    QCoreApplication::processEvents(QEventLoop::AllEvents, 5);
    if (!done()) QThread::msleep(1);
  }
  return done();
}

// Collects the warnings (and worse) Qt reports while it lives.
class QtWarnings {
 public:
  QtWarnings() {
    current() = this;
    previous_ = qInstallMessageHandler(&QtWarnings::handle);
  }
  ~QtWarnings() {
    qInstallMessageHandler(previous_);
    current() = nullptr;
  }
  QtWarnings(const QtWarnings&) = delete;
  QtWarnings& operator=(const QtWarnings&) = delete;
  [[nodiscard]] const QStringList& messages() const { return messages_; }

 private:
  static QtWarnings*& current() {
    static QtWarnings* instance = nullptr;
    return instance;
  }
  static void handle(QtMsgType type, const QMessageLogContext&, const QString& message) {
    if (type != QtDebugMsg && type != QtInfoMsg && current()) current()->messages_ << message;
  }
  QtMessageHandler previous_ = nullptr;
  QStringList messages_;
};

}  // namespace trainplan::testing
