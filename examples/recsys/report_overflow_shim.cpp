// fbgemm-gpu-cpu 1.9.0 is built against torch 2.14, whose libc10 exports
// c10::report_overflow(const char*); torch 2.15 made that function inline in a header,
// so fbgemm's libraries fail to load there ("undefined symbol:
// _ZN3c1015report_overflowEPKc"). Preloaded (setup_torchrec.sh builds it), this library
// defines it again: it throws the error torch would for a value that does not fit its
// type. Nothing else of torch is touched.
#include <stdexcept>
#include <string>

namespace c10 {

[[noreturn]] __attribute__((visibility("default"))) void report_overflow(const char* name) {
  throw std::runtime_error(std::string("value cannot be converted to type ") + name + " without overflow");
}

}  // namespace c10
