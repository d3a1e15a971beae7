// torch_chorus._C: the Python face of ProcessGroupChorus. torch_chorus/__init__.py
// imports it after torch and registers its creator as the "chorus" backend.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "c10d/process_group.h"

namespace py = pybind11;
using chorus::c10d_backend::ProcessGroupChorus;

PYBIND11_MODULE(_C, m) {
  m.doc() = "chorus collectives as a torch.distributed process group";
  // The base class is registered by torch; importing it first makes that so.
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupChorus, chorus::c10d_backend::BackendBase,
             c10::intrusive_ptr<ProcessGroupChorus>>(m, "ProcessGroupChorus")
      .def_property_readonly("backend_name", &ProcessGroupChorus::getBackendName);
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) {
        // Connecting waits for every rank: others in this process may need the GIL.
        py::gil_scoped_release no_gil;
        return c10::make_intrusive<ProcessGroupChorus>(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      "Connects rank `rank` of `size` through `store`; collective. Raises RuntimeError "
      "naming what failed (a timeout names the ranks that never came).");
  m.attr("torch_version_major") = TORCH_VERSION_MAJOR;
}
