# chorus_torch's data side: IDX datasets, DistributedSampler, DataLoader.
# Included by the top-level CMakeLists.txt once find_package(Torch) succeeded.
# Defines chorus_torch_objects' companion chorus_torch_data_objects and the static
# chorus_torch_data; the installed shared libchorus_torch holds both halves
# (cmake/chorus_install.cmake).

find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)

# Like chorus_torch_objects, the public headers only: src/ is not on its include path.
file(GLOB CHORUS_TORCH_DATA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/torch/data/*.cc)
add_library(chorus_torch_data_objects OBJECT ${CHORUS_TORCH_DATA_SOURCES})
chorus_public_interface(chorus_torch_data_objects)
target_link_libraries(chorus_torch_data_objects PUBLIC ${TORCH_LIBRARIES} PRIVATE ZLIB::ZLIB Threads::Threads)
add_library(chorus_torch_data STATIC $<TARGET_OBJECTS:chorus_torch_data_objects>)
chorus_public_interface(chorus_torch_data)
target_link_libraries(chorus_torch_data PUBLIC ${TORCH_LIBRARIES} PRIVATE ZLIB::ZLIB Threads::Threads)

# Its tests (tests/torch/*_test.cc) are built by tests/CMakeLists.txt like every other.
