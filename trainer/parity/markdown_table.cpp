// The Markdown form of a ParityResult: the runs compared, one row per figure, the verdict,
// then the warnings and notes a reader needs before trusting the numbers.
#include <sstream>

#include "trainer/parity/figure_format.h"
#include "trainer/parity/parity.h"

namespace partrain::parity {
namespace {

// A '|' inside a cell would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

std::string value_or_dash(const std::optional<double>& value, const std::string& unit) {
  return value ? format_figure(*value, unit) : "—";
}

std::string band(const std::optional<Tolerance>& tol) {
  if (!tol) return "—";
  if (tol->min && tol->max) return fixed(*tol->min, 3) + " – " + fixed(*tol->max, 3);
  if (tol->min) return "≥ " + fixed(*tol->min, 3);
  return "≤ " + fixed(*tol->max, 3);
}

std::string verdict(Verdict v) {
  switch (v) {
    case Verdict::kWithin:
      return "within";
    case Verdict::kOutside:
      return "**outside**";
    case Verdict::kInfo:
      break;
  }
  return "—";
}

void run_row(std::ostringstream& out, const RunSummary& run) {
  out << "| " << run.role << " | `" << cell(run.path) << "` | " << run.devices << " × "
      << run.device_kind << " | " << run.backend << " | " << run.batch_size_per_rank << " | "
      << run.total_batch << " | " << run.num_workers << " | " << run.epochs_run << " | "
      << (run.memory_source.empty() ? "—" : run.memory_source) << " |\n";
}

}  // namespace

std::string to_markdown(const ParityResult& result) {
  const Reference& ref = result.reference;
  std::ostringstream out;
  out << "## Parity against " << ref.name << "\n\n";
  out << "Reference: `" << cell(ref.path) << "`";
  std::string about;
  for (const std::string& part : {ref.os, ref.backend, ref.dataset, ref.model}) {
    if (!part.empty()) about += (about.empty() ? "" : ", ") + part;
  }
  if (ref.epochs) about += (about.empty() ? "" : ", ") + std::to_string(*ref.epochs) + " epochs";
  if (!about.empty()) out << " (" << about << ")";
  out << ".\n\n";

  out << "| Run | Report | Devices | Backend | Batch per rank | Total batch | Loader threads "
         "| Epochs | Memory from |\n"
      << "|---|---|---|---|--:|--:|--:|--:|---|\n";
  run_row(out, result.single);
  run_row(out, result.parallel);
  if (result.extra) run_row(out, *result.extra);
  out << "\n";

  out << "| Figure | Ours | Reference | Ours / ref | Tolerance | Verdict |\n"
      << "|---|--:|--:|--:|---|---|\n";
  int checked = 0;
  std::vector<std::string> outside;
  for (const Figure& f : result.figures) {
    std::string label = f.label;
    if (f.unit == "s" || f.unit == "img/s") label += " (" + f.unit + ")";
    out << "| " << cell(label) << " | " << value_or_dash(f.ours, f.unit) << " | "
        << value_or_dash(f.reference, f.unit) << " | " << value_or_dash(f.ratio, "") << " | "
        << band(f.tolerance) << " | " << verdict(f.verdict) << " |\n";
    if (f.verdict != Verdict::kInfo) ++checked;
    if (f.verdict == Verdict::kOutside) outside.push_back(f.label);
  }
  out << "\n";
  if (outside.empty()) {
    out << "**Result: " << within_words(checked) << ".**\n";
  } else {
    out << "**Result: " << outside.size() << " of " << checked
        << " checked figures outside tolerance:";
    for (std::size_t i = 0; i < outside.size(); ++i) out << (i ? ";" : "") << " " << outside[i];
    out << ".**\n";
  }
  if (!result.warnings.empty()) {
    out << "\n### Warnings\n\n";
    for (const auto& w : result.warnings) out << "- " << w << "\n";
  }
  if (!result.notes.empty()) {
    out << "\n### Notes\n\n";
    for (const auto& n : result.notes) out << "- " << n << "\n";
  }
  return out.str();
}

}  // namespace partrain::parity
