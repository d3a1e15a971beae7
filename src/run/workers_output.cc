// Where a worker's output goes (workers_impl.h): split into lines, copied to the
// console (with a rank prefix when tee'd; status lines redrawn in place on a terminal),
// to the per-rank log files, and kept as the last lines for reports.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "run/workers_impl.h"

namespace chorus::run {
namespace {

// A line with no newline for this long is passed on in pieces of this size.
constexpr size_t kMaxLineBytes = 64 * 1024;
// A console that accepts nothing for this long loses the rest of the line batch, so that
// a stuck reader of chorusrun's output cannot stop the supervision.
constexpr milliseconds kConsoleStallDeadline{10000};

// Writes all of `data`; waits (bounded) when `fd` is non-blocking and full. Output that
// cannot be written (closed console, full disk) is dropped: a worker's output must
// never stop the launcher from supervising.
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  Deadline stall(kConsoleStallDeadline);
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      stall = Deadline(kConsoleStallDeadline);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN && !stall.expired()) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, stall.remaining_ms());
    } else {
      return;
    }
  }
}

// Splits complete lines off the front of `u.partial`; more than kMaxLineBytes without a
// line end are passed on as a line of kMaxLineBytes. Empty status lines ("\r" before
// the text, as some bars draw) are dropped.
std::vector<Line> take_lines(Unsplit& u) {
  std::vector<Line> lines;
  std::string& partial = u.partial;
  size_t start = 0;
  if (u.after_cr && !partial.empty()) {
    u.after_cr = false;
    if (partial[0] == '\n') {
      lines.push_back({std::move(u.cr_text), false});
      start = 1;
    }
  }
  while (true) {
    size_t end = partial.find_first_of("\r\n", start);
    size_t limit = start + kMaxLineBytes;
    if (end != std::string::npos && end <= limit) {
      std::string text = partial.substr(start, end - start);
      if (partial[end] == '\n' || (end + 1 < partial.size() && partial[end + 1] == '\n')) {
        lines.push_back({std::move(text), false});
        start = end + (partial[end] == '\n' ? 1 : 2);
        continue;
      }
      if (end + 1 == partial.size()) {  // a lone '\r' so far
        u.after_cr = true;
        u.cr_text = text;
      }
      if (!text.empty()) lines.push_back({std::move(text), true});
      start = end + 1;
    } else if (partial.size() > limit) {
      lines.push_back({partial.substr(start, kMaxLineBytes), false});
      start = limit;
    } else {
      break;
    }
  }
  partial.erase(0, start);
  return lines;
}

// Clears a terminal's current line (the cursor goes to its start).
constexpr const char* kClearLine = "\r\x1b[K";

}  // namespace

// ----- log files -----

void WorkerGroup::Impl::make_log_dir() {
  std::error_code error;
  std::filesystem::create_directories(options.log_dir, error);
  if (error)
    throw SystemError("cannot create log directory '" + options.log_dir + "': " + error.message());
}

Fd WorkerGroup::Impl::open_log(int rank, int stream) {
  if (options.log_dir.empty()) return Fd();
  std::string path = options.log_dir + "/rank_" + std::to_string(rank) +
                     (stream == kStdout ? ".stdout.log" : ".stderr.log");
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.valid())
    throw SystemError("cannot open log file '" + path + "': " + error_text(errno));
  return fd;
}

// ----- output -----

void WorkerGroup::Impl::read_output(Worker& w, int stream) {
  Output& output = w.outputs[stream];
  ssize_t n = ::read(output.pipe.get(), read_buffer.data(), read_buffer.size());
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n > 0) {
    output.unsplit.partial.append(read_buffer.data(), static_cast<size_t>(n));
    emit(w, stream, take_lines(output.unsplit));
    return;
  }
  close_output(w, stream);  // EOF (or a broken pipe)
}

// Closes a worker's pipe, passing on its unterminated last line.
void WorkerGroup::Impl::close_output(Worker& w, int stream) {
  flush_partial(w, stream);
  w.outputs[stream].pipe.reset();
}

// Console copy (prefixed when tee'd, none when redirected), log copy, and last lines.
// Status lines go to a terminal console only, where they replace the shown one; other
// lines clear the shown status, scroll above it, and redraw it, except the owner's,
// which ends it (an empty line keeps it as it is; another takes its place).
void WorkerGroup::Impl::emit(Worker& w, int stream, const std::vector<Line>& lines) {
  if (lines.empty()) return;
  const bool to_console = !contains(options.redirects, stream);
  const bool terminal = to_console && contains(options.terminals, stream);
  std::string prefix =
      contains(options.tee, stream) ? "[rank " + std::to_string(w.rank) + "]: " : "";
  std::string console, log;
  bool hidden = false;  // the shown status (of this stream) is cleared in `console`
  for (const auto& line : lines) {
    if (line.status) {
      if (!terminal) continue;
      if (shown.owner != nullptr && shown.stream != stream) end_status();
      console.append(kClearLine).append(prefix).append(line.text).append("\x1b[K");
      shown = {&w, stream, prefix + line.text};
      hidden = false;
      continue;
    }
    if (to_console) {
      if (shown.owner == &w && shown.stream == stream) {
        if (line.text.empty()) {
          console.push_back('\n');
        } else {
          console.append(kClearLine).append(prefix).append(line.text).push_back('\n');
        }
        shown = {};
        hidden = false;
      } else {
        if (shown.owner != nullptr && shown.stream == stream && !hidden) {
          console.append(kClearLine);
          hidden = true;
        }
        console.append(prefix).append(line.text).push_back('\n');
      }
    }
    if (w.outputs[stream].log.valid()) log.append(line.text).push_back('\n');
    remember(w, line.text);
  }
  if (hidden) console.append(shown.text).append("\x1b[K");
  if (!console.empty()) write_console(stream, console);
  if (!log.empty()) write_all(w.outputs[stream].log.get(), log);
}

int WorkerGroup::Impl::console_fd(int stream) {
  return stream == kStdout ? STDOUT_FILENO : STDERR_FILENO;
}

// Writes to a console stream. A status shown by the other stream on the same terminal
// is cleared first and redrawn after.
void WorkerGroup::Impl::write_console(int stream, const std::string& text) {
  const bool other_shown = shown.owner != nullptr && shown.stream != stream &&
                           contains(options.terminals, stream);
  if (other_shown) write_all(console_fd(shown.stream), kClearLine);
  write_all(console_fd(stream), text);
  if (other_shown) write_all(console_fd(shown.stream), shown.text + "\x1b[K");
}

// The shown status stays on the terminal as it is; what follows starts below it.
void WorkerGroup::Impl::end_status() {
  if (shown.owner == nullptr) return;
  write_all(console_fd(shown.stream), "\n");
  shown = {};
}

void WorkerGroup::Impl::remember(Worker& w, const std::string& line) {
  if (options.last_lines == 0) return;
  w.last_lines.push_back(line);
  while (w.last_lines.size() > options.last_lines) w.last_lines.pop_front();
}

void WorkerGroup::Impl::flush_partial(Worker& w, int stream) {
  Unsplit& u = w.outputs[stream].unsplit;
  u.after_cr = false;
  if (!u.partial.empty()) emit(w, stream, {{std::move(u.partial), false}});
  u.partial.clear();
  // A worker whose output ended leaves its status on the terminal, finished.
  if (shown.owner == &w && shown.stream == stream) end_status();
}

}  // namespace chorus::run
