#pragma once
// Writing what the window shows to files: a widget (chart, schedule view, the whole window) as
// PNG or SVG, chosen by the file's suffix, and text files written whole or not at all.

#include <QString>

QT_BEGIN_NAMESPACE
class QWidget;
QT_END_NAMESPACE

namespace trainplan::gui {

// Renders `widget` at its current size to `path`: ".png" (raster, via grab) or ".svg" (vector,
// via QSvgGenerator). False with `error` set ("chart.gif: unknown image type (use .png or .svg)",
// "out/x.png: cannot write") on failure.
bool save_widget_image(QWidget* widget, const QString& path, QString* error);

// Writes `text` to `path` through a temporary file renamed over it. False with `error` set.
bool save_text_file(const QString& path, const QString& text, QString* error);

}  // namespace trainplan::gui
