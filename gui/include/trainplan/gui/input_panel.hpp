#pragma once
// InputPanel: the planning inputs (model, cluster and GPU count, training, objective, fixed
// parallel settings) as editable fields that produce a RequestForm. Every field may hold any text;
// set_errors() marks the wrong ones inline with the reason (red frame, a line under the field).
// Field names are those of FieldError ("model/layers", "gpus", "fix/tp"); each field widget has
// its field name as objectName, its error label the field name + "/error".

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <QWidget>

#include "trainplan/gui/request_form.hpp"
#include "trainplan/planner/search.hpp"

QT_BEGIN_NAMESPACE
class QComboBox;
class QLabel;
class QSpinBox;
QT_END_NAMESPACE

namespace trainplan::gui {

class InputPanel : public QWidget {
  Q_OBJECT
 public:
  explicit InputPanel(QWidget* parent = nullptr);

  [[nodiscard]] RequestForm form() const;
  [[nodiscard]] planner::Objective objective() const;

  // Marks the fields of `errors` (and clears the others). Errors of fields the panel does not
  // show go to the line at the top.
  void set_errors(const std::vector<FieldError>& errors);
  // The reason shown at a field ("" when it is fine); field "" gives the line at the top.
  [[nodiscard]] QString error_text(const QString& field) const;

  // Sets a field as if typed (line edits: the text; lists: the entry whose value or text is
  // `text`; check boxes: "true"/"false") and emits changed(). False for an unknown field or value.
  bool set_field(const QString& field, const QString& text);
  [[nodiscard]] QString field_text(const QString& field) const;

  // Uses a model document read from `path` (listed as "path (file)").
  void set_loaded_model(const QString& path, const nlohmann::json& document);
  // Fills every field from a plan request (presets by name, other documents as loaded ones).
  void load_request(const costmodel::PlanRequest& request, const QString& source);

 signals:
  void changed();
  void loadModelRequested();

 private:
  void fill_document_fields(const QString& document, const nlohmann::json& doc);
  void model_chosen();
  void cluster_chosen();
  void update_nodes_from_gpus();

  std::map<QString, QWidget*> fields_;
  std::map<QString, QLabel*> error_labels_;
  QLabel* form_errors_ = nullptr;
  QComboBox* model_ = nullptr;
  QComboBox* cluster_ = nullptr;
  QSpinBox* nodes_ = nullptr;
  QComboBox* batch_unit_ = nullptr;
  QComboBox* objective_ = nullptr;
  std::optional<nlohmann::json> loaded_model_, loaded_cluster_;
  QString loaded_model_path_, loaded_cluster_path_;
  bool filling_ = false;  // true while fields are set from a document (no changed())
};

}  // namespace trainplan::gui
