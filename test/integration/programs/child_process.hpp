// For tests that need a second process (IPC, failures injected through the environment): run
// this program again as a child, and pass bytes (an IPC handle) to it on the command line.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace prog {

// `in_child` runs in the forked child before the exec (environment changes). Returns the child's
// exit status, 128 if it did not exit.
template <typename Fn>
int run_self(const std::vector<std::string>& args, Fn in_child) {
    const pid_t pid = fork();
    if (pid == 0) {
        in_child();
        std::vector<char*> argv;
        for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// Bytes as lowercase hex, and back (`hex` holds 2 * n digits).
inline std::string to_hex(const void* data, std::size_t n) {
    std::string s;
    char b[3];
    for (std::size_t i = 0; i < n; ++i) {
        std::snprintf(b, sizeof b, "%02x", static_cast<const unsigned char*>(data)[i]);
        s += b;
    }
    return s;
}
inline void from_hex(const char* hex, void* data, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
        unsigned v = 0;
        std::sscanf(hex + 2 * i, "%2x", &v);
        static_cast<unsigned char*>(data)[i] = static_cast<unsigned char>(v);
    }
}

}  // namespace prog
