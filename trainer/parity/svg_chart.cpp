// The SVG chart of a ParityResult: two bar panels, epoch time and memory per device, each
// relative to its own single run (= 1.0) so that ours and the reference's sit on one scale
// although the hardware differs. Ours and the reference's bars stand side by side per group.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "trainer/parity/figure_format.h"
#include "trainer/parity/parity.h"

namespace partrain::parity {
namespace {

constexpr int kWidth = 1000;
constexpr int kHeight = 560;
constexpr int kPlotTop = 150;
constexpr int kPlotBottom = 430;
constexpr const char* kOursColour = "#2f6db5";
constexpr const char* kRefColour = "#e08a3c";
constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

struct BarGroup {
  std::string label;
  std::vector<std::string> sublabels;  // absolute figures under the label, one per line
  std::optional<double> ours;
  std::optional<double> reference;
};

struct Panel {
  std::string title;
  std::string caption;  // the checked figures and their verdicts
  std::string y_label;
  std::string x_label;
  std::vector<BarGroup> groups;
};

class Svg {
 public:
  void text(double x, double y, const std::string& s, int size, const std::string& anchor = "start",
            const std::string& extra = "") {
    out_ << "<text x=\"" << fixed(x, 1) << "\" y=\"" << fixed(y, 1) << "\" font-size=\"" << size
         << "\" text-anchor=\"" << anchor << "\"" << (extra.empty() ? "" : " " + extra) << ">"
         << escape(s) << "</text>\n";
  }
  void rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& extra = "") {
    out_ << "<rect x=\"" << fixed(x, 1) << "\" y=\"" << fixed(y, 1) << "\" width=\"" << fixed(w, 1)
         << "\" height=\"" << fixed(h, 1) << "\" fill=\"" << fill << "\""
         << (extra.empty() ? "" : " " + extra) << "/>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
            const std::string& extra = "") {
    out_ << "<line x1=\"" << fixed(x1, 1) << "\" y1=\"" << fixed(y1, 1) << "\" x2=\""
         << fixed(x2, 1) << "\" y2=\"" << fixed(y2, 1) << "\" stroke=\"" << stroke
         << "\" stroke-width=\"" << fixed(width, 1) << "\"" << (extra.empty() ? "" : " " + extra)
         << "/>\n";
  }
  std::ostringstream& raw() { return out_; }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

// The y axis runs from 0 to a round number above the tallest bar, with 4 to 8 ticks.
double tick_step(double top) {
  for (double step : {0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0}) {
    if (top / step <= 8.0) return step;
  }
  return std::ceil(top / 8.0);
}

void draw_panel(Svg& svg, const Panel& panel, double left, double width) {
  const double plot_left = left + 60;
  const double plot_right = left + width - 10;
  const double plot_height = kPlotBottom - kPlotTop;

  svg.text((plot_left + plot_right) / 2, kPlotTop - 42, panel.title, 16, "middle",
           "font-weight=\"bold\"");
  svg.text((plot_left + plot_right) / 2, kPlotTop - 22, panel.caption, 12, "middle",
           "fill=\"#333\"");

  double tallest = 1.0;
  for (const auto& g : panel.groups) {
    if (g.ours) tallest = std::max(tallest, *g.ours);
    if (g.reference) tallest = std::max(tallest, *g.reference);
  }
  const double step = tick_step(tallest * 1.12);
  const double top = std::ceil(tallest * 1.12 / step) * step;
  auto y_of = [&](double v) { return kPlotBottom - v / top * plot_height; };

  for (double v = 0.0; v <= top + step / 2; v += step) {
    const double y = y_of(v);
    svg.line(plot_left, y, plot_right, y, "#e4e4e4", 1);
    svg.text(plot_left - 8, y + 4, fixed(v, step < 0.25 ? 1 : 2), 11, "end", "fill=\"#555\"");
  }
  svg.line(plot_left, kPlotTop, plot_left, kPlotBottom, "#444", 1);
  svg.line(plot_left, kPlotBottom, plot_right, kPlotBottom, "#444", 1);
  // The single run is 1.0 by construction: a bar below the line is better than single.
  svg.line(plot_left, y_of(1.0), plot_right, y_of(1.0), "#777", 1, "stroke-dasharray=\"5,4\"");

  const double mid_y = (kPlotTop + kPlotBottom) / 2.0;
  svg.raw() << "<text x=\"" << fixed(left + 16, 1) << "\" y=\"" << fixed(mid_y, 1)
            << "\" font-size=\"13\" text-anchor=\"middle\" transform=\"rotate(-90 "
            << fixed(left + 16, 1) << " " << fixed(mid_y, 1) << ")\">" << escape(panel.y_label)
            << "</text>\n";
  svg.text((plot_left + plot_right) / 2, kPlotBottom + 72, panel.x_label, 13, "middle");

  const double group_width = (plot_right - plot_left) / static_cast<double>(panel.groups.size());
  const double bar_width = std::min(46.0, group_width * 0.34);
  for (std::size_t i = 0; i < panel.groups.size(); ++i) {
    const BarGroup& g = panel.groups[i];
    const double centre = plot_left + group_width * (static_cast<double>(i) + 0.5);
    const std::pair<std::optional<double>, const char*> bars[] = {{g.ours, kOursColour},
                                                                  {g.reference, kRefColour}};
    for (int b = 0; b < 2; ++b) {
      const double x = centre + (b == 0 ? -bar_width - 2 : 2);
      const auto& [value, colour] = bars[b];
      if (!value) {
        svg.text(x + bar_width / 2, kPlotBottom - 6, "n/a", 11, "middle", "fill=\"#999\"");
        continue;
      }
      svg.rect(x, y_of(*value), bar_width, kPlotBottom - y_of(*value), colour);
      svg.text(x + bar_width / 2, y_of(*value) - 5, fixed(*value, 2), 12, "middle",
               "font-weight=\"bold\" fill=\"#222\"");
    }
    svg.text(centre, kPlotBottom + 18, g.label, 13, "middle");
    for (std::size_t line = 0; line < g.sublabels.size(); ++line) {
      svg.text(centre, kPlotBottom + 33 + 13 * static_cast<double>(line), g.sublabels[line], 10,
               "middle", "fill=\"#555\"");
    }
  }
}

const Figure* find_figure(const ParityResult& result, const std::string& id) {
  for (const auto& f : result.figures) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

std::string verdict_word(const Figure& f) {
  return f.verdict == Verdict::kWithin ? "within" : f.verdict == Verdict::kOutside ? "OUTSIDE" : "";
}

std::string compare_caption(const Figure* f, const std::string& name) {
  if (!f || !f->ours) return "";
  std::string s = name + " " + fixed(*f->ours, 2);
  if (f->reference) s += " vs ref " + fixed(*f->reference, 2);
  const std::string v = verdict_word(*f);
  if (!v.empty()) s += " (" + v + ")";
  return s;
}

Panel time_panel(const ParityResult& r) {
  const Reference& ref = r.reference;
  Panel p;
  p.title = "Epoch time relative to the single run";
  p.y_label = "epoch time ÷ single-run epoch time (lower is faster)";
  p.x_label = "run (total batch " + std::to_string(r.single.total_batch) + " single, " +
              std::to_string(r.parallel.total_batch) + " " + r.parallel.role + ")";
  p.caption = compare_caption(find_figure(r, kSpeedup), "speed-up");

  std::optional<double> ref_single_s, ref_parallel_s;
  if (ref.epochs && ref.single.seconds) ref_single_s = *ref.single.seconds / *ref.epochs;
  if (ref.epochs && ref.parallel.seconds) ref_parallel_s = *ref.parallel.seconds / *ref.epochs;
  auto seconds = [](double ours, std::optional<double> theirs) {
    std::vector<std::string> lines = {"ours " + format_figure(ours, "s") + " s"};
    if (theirs) lines.push_back("ref " + format_figure(*theirs, "s") + " s");
    return lines;
  };
  const double single_s = r.single.mean_epoch_seconds;
  p.groups.push_back({"single (1 × " + r.single.device_kind + ")", seconds(single_s, ref_single_s),
                      1.0, ref.speedup ? std::optional<double>(1.0) : std::nullopt});
  p.groups.push_back({r.parallel.role + " (" + std::to_string(r.parallel.devices) + " × " +
                          r.parallel.device_kind + ")",
                      seconds(r.parallel.mean_epoch_seconds, ref_parallel_s),
                      r.parallel.mean_epoch_seconds / single_s,
                      ref.speedup ? std::optional<double>(1.0 / *ref.speedup) : std::nullopt});
  if (r.extra) {
    p.groups.push_back({r.extra->role + " (" + std::to_string(r.extra->devices) + " × " +
                            r.extra->device_kind + ")",
                        seconds(r.extra->mean_epoch_seconds, std::nullopt),
                        r.extra->mean_epoch_seconds / single_s, std::nullopt});
  }
  return p;
}

Panel memory_panel(const ParityResult& r) {
  const Reference& ref = r.reference;
  Panel p;
  p.title = "Memory per device relative to the single run";
  p.y_label = "memory per device ÷ single-run memory (lower is leaner)";
  p.x_label = "device of the " + r.parallel.role + " run";
  std::string caption = compare_caption(find_figure(r, kMemoryRatio), "largest");
  const std::string balance = compare_caption(find_figure(r, kBalance), "balance");
  if (!balance.empty()) caption += (caption.empty() ? "" : " · ") + balance;
  p.caption = caption;

  const double single_mb = r.single.memory_mb.empty() ? 0.0 : r.single.memory_mb[0];
  const bool ref_has = !ref.memory_ratio.empty();
  auto mb = [](double ours, std::optional<double> theirs) {
    std::vector<std::string> lines = {"ours " + fixed(ours, 0) + " MB"};
    if (theirs) lines.push_back("ref " + fixed(*theirs, 0) + " MB");
    return lines;
  };
  auto ref_mb = [&](const std::vector<double>& list, std::size_t i) -> std::optional<double> {
    return i < list.size() ? std::optional<double>(list[i]) : std::nullopt;
  };
  if (single_mb <= 0.0) return p;
  p.groups.push_back({"single", mb(single_mb, ref_mb(ref.single.memory_mb, 0)), 1.0,
                      ref_has ? std::optional<double>(1.0) : std::nullopt});
  const std::size_t count = std::max(r.parallel.memory_mb.size(), ref.memory_ratio.size());
  for (std::size_t i = 0; i < count; ++i) {
    BarGroup g;
    // dp: one process drives all devices, so its one figure is the process's, not a device's
    const bool per_device = static_cast<int>(r.parallel.memory_mb.size()) == r.parallel.devices;
    g.label = r.parallel.role + (per_device ? " device " + std::to_string(i) : " process");
    if (i < r.parallel.memory_mb.size()) {
      g.ours = r.parallel.memory_mb[i] / single_mb;
      g.sublabels = mb(r.parallel.memory_mb[i], ref_mb(ref.parallel.memory_mb, i));
    }
    if (i < ref.memory_ratio.size()) g.reference = ref.memory_ratio[i];
    p.groups.push_back(g);
  }
  return p;
}

std::string memory_words(const std::string& source) {
  if (source == "cuda_peak_reserved_mb") return "CUDA allocator peak reserved";
  if (source == "cuda_peak_allocated_mb") return "CUDA allocator peak allocated";
  return "peak RSS per process";
}

}  // namespace

std::string to_svg(const ParityResult& result) {
  const Reference& ref = result.reference;
  Svg svg;
  svg.raw() << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\""
            << kHeight << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\""
            << kFont << "\">\n";
  svg.rect(0, 0, kWidth, kHeight, "#ffffff");

  int checked = 0, outside = 0;
  for (const auto& f : result.figures) {
    if (f.verdict != Verdict::kInfo) ++checked;
    if (f.verdict == Verdict::kOutside) ++outside;
  }
  svg.text(24, 34, "partrain parity: ours vs " + ref.name, 18, "start", "font-weight=\"bold\"");
  const std::string verdict = outside == 0
                                  ? within_words(checked)
                                  : std::to_string(outside) + " of " + std::to_string(checked) +
                                        " checked figures OUTSIDE tolerance";
  svg.text(24, 58, verdict, 14, "start",
           std::string("font-weight=\"bold\" fill=\"") + (outside ? "#b42318" : "#217a3c") + "\"");
  if (!result.warnings.empty()) {
    svg.text(24, 78,
             std::to_string(result.warnings.size()) +
                 " warning(s): the runs differ in more than parallelism — see the table",
             12, "start", "fill=\"#8a5a00\"");
  }

  // Legend, top right.
  const double lx = kWidth - 230;
  svg.rect(lx, 22, 16, 16, kOursColour);
  const std::string backend =
      result.parallel.backend == "none" ? "" : result.parallel.backend + ", ";
  svg.text(lx + 22, 35, "ours (" + backend + result.parallel.device_kind + ")", 13);
  svg.rect(lx, 46, 16, 16, kRefColour);
  svg.text(lx + 22, 59, "reference" + (ref.backend.empty() ? "" : " (" + ref.backend + ", gpu)"),
           13);

  svg.line(lx, 78, lx + 16, 78, "#777", 1.5, "stroke-dasharray=\"4,3\"");
  svg.text(lx + 22, 83, "single run = 1.0", 13);

  draw_panel(svg, time_panel(result), 10, kWidth / 2.0 - 20);
  const Panel memory = memory_panel(result);
  if (memory.groups.empty()) {
    svg.text(kWidth * 0.75, (kPlotTop + kPlotBottom) / 2.0, "no memory figures to compare", 14,
             "middle", "fill=\"#999\"");
  } else {
    draw_panel(svg, memory, kWidth / 2.0 + 10, kWidth / 2.0 - 20);
  }

  std::string footer = "Memory: ours = " + memory_words(result.single.memory_source) + " (" +
                       result.single.device_kind + ")";
  if (!ref.memory_ratio.empty()) {
    footer += "; reference = device memory as " +
              (ref.memory_source.empty() ? std::string("reported") : ref.memory_source) +
              " shows it (includes CUDA context and cached blocks)";
  }
  svg.text(24, kHeight - 34, footer + ".", 11, "start", "fill=\"#555\"");
  svg.text(24, kHeight - 16,
           "Each panel divides by its own single run, so ours and the reference compare although "
           "the hardware differs.",
           11, "start", "fill=\"#555\"");
  svg.raw() << "</svg>\n";
  return svg.str();
}

}  // namespace partrain::parity
