# chorus_torch's data side: IDX datasets, DistributedSampler, DataLoader.
# Included by the top-level CMakeLists.txt once find_package(Torch) succeeded.
# Defines the target chorus_torch_data; nothing else.

find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)

file(GLOB CHORUS_TORCH_DATA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/torch/data/*.cc)
add_library(chorus_torch_data STATIC ${CHORUS_TORCH_DATA_SOURCES})
target_include_directories(chorus_torch_data
  PUBLIC ${CMAKE_SOURCE_DIR}/include
  PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(chorus_torch_data PUBLIC ${TORCH_LIBRARIES} PRIVATE ZLIB::ZLIB Threads::Threads)

# Its tests (tests/torch/*_test.cc) are built by tests/CMakeLists.txt like every other.
