// Runs a function in a forked child process (one rank of a multi-process group) and collects how
// it ended: its exit code and the message of the error it threw, if any.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace kiln::test {

struct Child {
  pid_t pid = -1;
  int message_fd = -1;  // read end of the pipe the child writes its error into
};

struct ChildEnd {
  int exit_code = -1;   // 128 + signal when killed; -1 when it outlived the limit (then killed)
  std::string message;  // the error the child's function threw ("" when it returned)
};

inline Child spawn_child(const std::function<void()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int code = 0;
    std::string message;
    try {
      fn();
    } catch (const std::exception& e) {
      message = e.what();
      code = 1;
    }
    if (!message.empty()) [[maybe_unused]]
      auto n = write(fds[1], message.data(), message.size());
    close(fds[1]);
    _exit(code);  // no atexit handlers or gtest teardown in the child
  }
  close(fds[1]);
  return {pid, fds[0]};
}

// Waits up to `limit` for the child to exit; a child still running then is killed and reported
// with exit code -1, which the tests treat as a hang.
inline ChildEnd wait_child(Child c, std::chrono::seconds limit) {
  ChildEnd end;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  bool exited = false;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  } else {
    end.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(c.message_fd, buf, sizeof buf)) > 0) end.message.append(buf, static_cast<size_t>(n));
  close(c.message_fd);
  return end;
}

// Kills a child at once and reaps it.
inline void kill_child(Child c) {
  kill(c.pid, SIGKILL);
  int status = 0;
  waitpid(c.pid, &status, 0);
  close(c.message_fd);
}

}  // namespace kiln::test
