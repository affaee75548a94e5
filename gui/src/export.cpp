#include "trainplan/gui/export.hpp"

#include <QFileInfo>
#include <QImage>
#include <QPainter>
#include <QPixmap>
#include <QSaveFile>
#include <QSvgGenerator>
#include <QWidget>

namespace trainplan::gui {

bool save_widget_image(QWidget* widget, const QString& path, QString* error) {
  const QString suffix = QFileInfo(path).suffix().toLower();
  const auto fail = [&](const QString& message) {
    if (error) *error = path + QStringLiteral(": ") + message;
    return false;
  };
  if (suffix == QStringLiteral("png")) {
    const QPixmap pixmap = widget->grab();
    if (pixmap.isNull()) return fail(QStringLiteral("nothing to render"));
    if (!pixmap.save(path, "PNG")) return fail(QStringLiteral("cannot write"));
    return true;
  }
  if (suffix == QStringLiteral("svg")) {
    QSaveFile file(path);
    if (!file.open(QIODevice::WriteOnly)) return fail(QStringLiteral("cannot write"));
    {
      QSvgGenerator svg;
      svg.setOutputDevice(&file);
      svg.setSize(widget->size());
      svg.setViewBox(QRect(QPoint(0, 0), widget->size()));
      svg.setTitle(widget->windowTitle().isEmpty() ? QStringLiteral("trainplan") : widget->windowTitle());
      svg.setDescription(QStringLiteral("Rendered by trainplan-gui"));
      QPainter painter(&svg);
      widget->render(&painter);
    }
    if (!file.commit()) return fail(QStringLiteral("cannot write"));
    return true;
  }
  return fail(QStringLiteral("unknown image type (use .png or .svg)"));
}

bool save_text_file(const QString& path, const QString& text, QString* error) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly | QIODevice::Text)) {
    if (error) *error = path + QStringLiteral(": cannot write");
    return false;
  }
  file.write(text.toUtf8());
  if (!file.commit()) {
    if (error) *error = path + QStringLiteral(": write failed");
    return false;
  }
  return true;
}

}  // namespace trainplan::gui
