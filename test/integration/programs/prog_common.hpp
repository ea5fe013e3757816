// Helpers shared by the integration test programs. Each program prints, as its LAST stdout line, one
// JSON object with its own counts ("allocs", "frees", "bytes": sum of the sizes it asked for in
// successful allocation calls, plus program-specific fields) and exits 0 only if every call
// succeeded and every buffer read back what was written.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace prog {

inline int& failures() {
    static int n = 0;
    return n;
}

inline void fail(const char* file, int line, const char* what, long long code) {
    std::fprintf(stderr, "%s:%d: %s failed (%lld)\n", file, line, what, code);
    ++failures();
}

// One line of JSON: {"k": v, ...}; values are integers or booleans (given as strings "true"/"false").
struct Json {
    std::vector<std::pair<std::string, std::string>> kv;
    Json& num(const char* k, long long v) {
        kv.emplace_back(k, std::to_string(v));
        return *this;
    }
    Json& boolean(const char* k, bool v) {
        kv.emplace_back(k, v ? "true" : "false");
        return *this;
    }
    void print() const {
        std::string s = "{";
        for (size_t i = 0; i < kv.size(); ++i) {
            if (i) s += ", ";
            s += "\"" + kv[i].first + "\": " + kv[i].second;
        }
        s += "}";
        std::printf("%s\n", s.c_str());
        std::fflush(stdout);
    }
};

inline int finish(const Json& j) {
    j.print();
    return failures() == 0 ? 0 : 1;
}

}  // namespace prog

// Runtime API call that must return cudaSuccess.
#define RT(call)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) prog::fail(__FILE__, __LINE__, #call, e_);         \
    } while (0)
// Driver API call that must return CUDA_SUCCESS.
#define DRV(call)                                                                 \
    do {                                                                          \
        CUresult r_ = (call);                                                     \
        if (r_ != CUDA_SUCCESS) prog::fail(__FILE__, __LINE__, #call, r_);        \
    } while (0)
#define EXPECT(cond)                                                              \
    do {                                                                          \
        if (!(cond)) prog::fail(__FILE__, __LINE__, #cond, 0);                    \
    } while (0)
