// torch_chorus._C: the Python face of ProcessGroupChorus. torch_chorus/__init__.py
// imports it after torch and registers its creator as the "chorus" backend.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "c10d/process_group.h"
#include "c10d/shared_allocator.h"
#include "chorus/shared_memory.h"

namespace py = pybind11;
using chorus::c10d_backend::ProcessGroupChorus;

namespace {

// The Python object's reference to a group, dropped without the GIL: a group's destructor
// waits for its pending operations and the threads that complete their futures, whose
// Python callbacks (DDP's comm hooks, Future.then) take the GIL. Dropped with it
// (destroy_process_group with such a callback still to run), the two would wait for
// each other for good. torch holds its own groups the same way.
template <typename T>
class ReleasedWithoutGil {
 public:
  ReleasedWithoutGil() = default;
  ReleasedWithoutGil(c10::intrusive_ptr<T> ptr) : ptr_(std::move(ptr)) {}  // NOLINT: implicit
  // pybind11 makes a holder from a new object's pointer: the reference it was born with.
  explicit ReleasedWithoutGil(T* ptr) : ptr_(c10::intrusive_ptr<T>::unsafe_steal_from_new(ptr)) {}
  ReleasedWithoutGil(const ReleasedWithoutGil&) = default;
  ReleasedWithoutGil(ReleasedWithoutGil&&) = default;
  ReleasedWithoutGil& operator=(const ReleasedWithoutGil&) = default;
  ReleasedWithoutGil& operator=(ReleasedWithoutGil&&) = default;
  ~ReleasedWithoutGil() {
    if (ptr_ && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      ptr_.reset();
    }
  }
  T* get() const { return ptr_.get(); }

 private:
  // torch's casters read a group's holder as c10::intrusive_ptr<base>: this is its only
  // member, as in torch's own holder.
  c10::intrusive_ptr<T> ptr_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, ReleasedWithoutGil<T>, true);

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus collectives as a torch.distributed process group";
  // The base class is registered by torch; importing it first makes that so.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupChorus, chorus::c10d_backend::BackendBase,
             ReleasedWithoutGil<ProcessGroupChorus>>(m, "ProcessGroupChorus")
      .def_property_readonly("backend_name", &ProcessGroupChorus::getBackendName)
      .def("_drain_callbacks", &ProcessGroupChorus::drain_callbacks,
           py::call_guard<py::gil_scoped_release>(),
           "Waits (at most the group's timeout) until the futures asked for have completed "
           "and their callbacks have run; returns whether they all did. torch_chorus calls "
           "it at exit.")
      .def(
          "direct_path_possible",
          [](ProcessGroupChorus& pg) { return pg.communicator().direct_path_possible(); },
          "Whether collectives on node-shared tensors can take the direct path (chorus's "
          "Communicator::direct_path_possible); the same on every rank.");
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        // Connecting waits for every rank: others in this process may need the GIL.
        py::gil_scoped_release no_gil;
        return ReleasedWithoutGil<ProcessGroupChorus>(
            c10::make_intrusive<ProcessGroupChorus>(store, rank, size, timeout));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      "Connects rank `rank` of `size` through `store`; collective. Raises RuntimeError "
      "naming what failed (a timeout names the ranks that never came).");
  m.attr("torch_version_major") = TORCH_VERSION_MAJOR;
  // The torch this module was compiled against: torch_chorus refuses another at import.
  m.attr("torch_version") = std::to_string(TORCH_VERSION_MAJOR) + "." +
                            std::to_string(TORCH_VERSION_MINOR) + "." +
                            std::to_string(TORCH_VERSION_PATCH);

  // Node-shared tensors (c10d/shared_allocator.h). The allocator is installed now, at
  // import, as c10 expects of a CPU allocator: before the program's threads allocate.
  namespace backend = chorus::c10d_backend;
  m.attr("shared_allocator_installed") = backend::install_shared_allocator();
  m.attr("shared_allocation_min_bytes") = backend::kSharedAllocationMinBytes;
  struct Scope {
    std::optional<backend::SharedAllocations> scope;
  };
  py::class_<Scope>(m, "SharedAllocations",
                    "with SharedAllocations(): this thread's CPU tensors of at least "
                    "shared_allocation_min_bytes are node-shared memory")
      .def(py::init<>())
      .def("__enter__", [](Scope& s) { s.scope.emplace(); })
      .def("__exit__", [](Scope& s, const py::args&) { s.scope.reset(); });
  m.def(
      "in_shared_memory",
      [](const at::Tensor& t) {
        const c10::Storage& storage = t.storage();
        return storage.data() != nullptr && chorus::in_shared_memory(storage.data(), storage.nbytes());
      },
      py::arg("tensor"), "Whether the tensor's storage is node-shared memory of this process.");
}
