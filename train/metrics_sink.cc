#include "train/metrics_sink.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/allocator.h"
#include "core/check.h"
#include "core/nvml.h"

namespace kiln::train {

MetricsSink::MetricsSink(const MetricsSinkOptions& options)
    : options_(options), started_(std::chrono::steady_clock::now()) {
  if (!options_.active) return;
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  if (error || !std::filesystem::is_directory(options_.dir)) {
    throw InputError("logging.dir " + options_.dir + ": cannot create the directory (" +
                     (error ? error.message() : "a file of that name exists") + ")");
  }
  if (options_.jsonl) {
    jsonl_ = std::make_unique<JsonlWriter>(options_.dir + "/metrics.jsonl", options_.append);
  }
  if (options_.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(options_.dir);
  if (options_.print && options_.progress) {
    bar_ = std::make_unique<ProgressBar>(options_.total_steps, true);
    redraw_ = std::thread([this] { redraw_every_second(); });
  }
}

MetricsSink::~MetricsSink() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    stop_redraw_.notify_all();
  }
  if (redraw_.joinable()) redraw_.join();
}

void MetricsSink::redraw_every_second() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    stop_redraw_.wait_for(lock, std::chrono::milliseconds(200));
    if (!stopping_ && bar_started_) draw_bar(std::chrono::milliseconds(1000));
  }
}

void MetricsSink::draw_bar(std::chrono::milliseconds unless_drawn_within) {
  const auto now = std::chrono::steady_clock::now();
  if (bar_on_line_ && now - last_draw_ < unless_drawn_within) return;
  bar_->update(bar_step_, bar_text_);
  check_stdout();
  bar_on_line_ = true;
  last_draw_ = now;
}

std::string MetricsSink::device_readings(Record& record) const {
  if (!options_.device.is_cuda()) return "";
  const AllocatorStats a = cuda_allocator(options_.device.index).stats();
  // In use: allocated, and the CUDA graphs' pools that every replay writes into.
  record.emplace_back("memory_allocated_bytes", static_cast<double>(a.in_use_bytes()));
  record.emplace_back("memory_graph_pool_bytes", static_cast<double>(a.graph_pool_bytes));
  record.emplace_back("memory_reserved_bytes", static_cast<double>(a.reserved_bytes));
  record.emplace_back("memory_fragmentation", a.fragmentation());
  std::string text = " mem " + format_bytes(a.in_use_bytes()) + "/" +
                     format_bytes(a.reserved_bytes) + " frag " +
                     std::to_string(static_cast<int>(100 * a.fragmentation())) + "%";
  if (auto gpu = NvmlSampler::instance().sample(options_.device.index)) {
    record.emplace_back("gpu_temperature_c", gpu->temperature_c);
    record.emplace_back("gpu_power_w", gpu->power_w);
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %.0fC %.0fW", gpu->temperature_c, gpu->power_w);
    text += buf;
  }
  return text;
}

void MetricsSink::write(RecordKind kind, std::int64_t step, Record record, const std::string& line,
                        const std::string& bar_text) {
  if (!options_.active) return;
  const std::string readings = device_readings(record);
  const bool train = kind == RecordKind::kTrain;
  if (jsonl_) {
    Record keyed = {{"step", static_cast<double>(step)}};
    for (const auto& [key, value] : record) keyed.emplace_back(train ? key : "eval_" + key, value);
    // When it was written: the wall clock (to join with other logs) and the seconds since this
    // process began the run (a resumed run counts from its restart).
    keyed.emplace_back(
        "time",
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    keyed.emplace_back(
        "elapsed_s",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
    jsonl_->write(keyed);
  }
  if (tensorboard_) {
    for (const auto& [key, value] : record) {
      tensorboard_->scalar((train ? "train/" : "eval/") + key, value, step);
    }
    tensorboard_->flush();
  }
  if (train && bar_) {
    std::lock_guard<std::mutex> lock(mutex_);
    bar_text_ = bar_text;
    bar_step_ = step;
    draw_bar(std::chrono::milliseconds(0));
    return;
  }
  if (!line.empty()) print(line + readings);
}

void MetricsSink::begin(std::int64_t step) {
  if (!options_.active || !bar_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  bar_step_ = step;
  bar_started_ = true;
  draw_bar(std::chrono::milliseconds(0));
}

void MetricsSink::tick(std::int64_t step) {
  if (!options_.active || !bar_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  bar_step_ = step;
  draw_bar(std::chrono::milliseconds(250));
}

void MetricsSink::print(const std::string& line) {
  if (!options_.active || !options_.print) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (bar_on_line_) {
    std::printf("\n");
    bar_on_line_ = false;
  }
  std::printf("%s\n", line.c_str());
  check_stdout();
}

void MetricsSink::check_stdout() {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return;
  const int error = errno != 0 ? errno : EIO;
  std::clearerr(stdout);
  if (!stdout_failure_.empty()) return;  // warned once
  stdout_failure_ = std::string("cannot write the log to stdout: ") + std::strerror(error);
  std::fprintf(stderr,
               "kiln: warning: %s. The run goes on; kiln train exits with code %d at its end\n",
               stdout_failure_.c_str(), kExitLogWriteFailed);
  std::fflush(stderr);
}

std::string MetricsSink::close() {
  if (!options_.active) return "";
  std::string failure;
  for (LogFile* f :
       {jsonl_ ? &jsonl_->file() : nullptr, tensorboard_ ? &tensorboard_->file() : nullptr}) {
    if (f == nullptr) continue;
    f->close();
    if (failure.empty()) failure = f->failure();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.print) check_stdout();
  return failure.empty() ? stdout_failure_ : failure;
}

void MetricsSink::finish() {
  if (!options_.active || !bar_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = true;
  stop_redraw_.notify_all();
  if (!bar_on_line_) return;
  bar_->finish();
  bar_on_line_ = false;
}

IntervalReport interval_report(const IntervalFigures& f) {
  IntervalReport report;
  const double tflops = f.samples_per_s * f.flops_per_sample / 1e12;
  report.record = {{"epoch", static_cast<double>(f.epoch)},
                   {"loss", f.mean_loss},
                   {"lr", f.lr},
                   {"loss_scale", f.loss_scale},
                   {"samples_per_s", f.samples_per_s},
                   {"tflops", tflops},
                   {"data_wait_fraction", f.wait_fraction}};
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "step %lld/%lld epoch %lld loss %.4f lr %.3g scale %.0f %.0f samples/s %.2f TFLOP/s",
      static_cast<long long>(f.step), static_cast<long long>(f.total_steps),
      static_cast<long long>(f.epoch), f.mean_loss, f.lr, f.loss_scale, f.samples_per_s, tflops);
  report.line = buf;
  const double tokens_per_s = f.samples_per_s * f.tokens_per_sample;
  if (f.tokens_per_sample > 0) {
    // Language models are measured in tokens: "samples/s" of 1024-token sequences says little.
    report.record.emplace_back("tokens_per_s", tokens_per_s);
    std::snprintf(buf, sizeof(buf), " %.0f tokens/s", tokens_per_s);
    report.line.insert(report.line.find(" samples/s") + std::strlen(" samples/s"), buf);
  }
  if (f.peak_flops > 0) {
    const double mfu = tflops * 1e12 / f.world_size / f.peak_flops;
    report.record.emplace_back("mfu", mfu);
    std::snprintf(buf, sizeof(buf), " MFU %.1f%%", 100.0 * mfu);
    report.line += buf;
  }
  report.record.emplace_back("ms_per_step", f.step_ms);
  std::snprintf(buf, sizeof(buf), " %.1f ms/step", f.step_ms);
  report.line += buf;
  // The share of the interval the step waited for the loader, once it is worth a look.
  if (f.wait_fraction >= kShownDataWait) {
    std::snprintf(buf, sizeof(buf), " data wait %.0f%%", 100.0 * f.wait_fraction);
    report.line += buf;
  }
  std::snprintf(buf, sizeof(buf), " elapsed %s ETA %s", format_duration(f.elapsed_s).c_str(),
                f.step >= f.total_steps ? "0s" : format_duration(f.eta_s).c_str());
  report.line += buf;
  if (f.grad_norm >= 0) report.record.emplace_back("grad_norm", f.grad_norm);
  if (f.fp8_overflows >= 0) report.record.emplace_back("fp8_overflows", f.fp8_overflows);
  if (f.weight_gathers >= 0) report.record.emplace_back("zero3_gathers_per_step", f.weight_gathers);
  if (f.fp8_overflows > 0) {  // an inf/NaN reached an FP8 cast: its scale was kept
    std::snprintf(buf, sizeof(buf), " (FP8 overflows so far: %.0f)", f.fp8_overflows);
    report.line += buf;
  }
  if (f.skipped) report.line += " (step skipped: inf/NaN gradients)";
  if (f.tokens_per_sample > 0) {
    std::snprintf(buf, sizeof(buf), "loss %.4f %.0f tokens/s", f.mean_loss, tokens_per_s);
  } else {
    std::snprintf(buf, sizeof(buf), "loss %.4f %.0f samples/s", f.mean_loss, f.samples_per_s);
  }
  report.bar_text = buf;
  return report;
}

}  // namespace kiln::train
