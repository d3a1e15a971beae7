// Open MPI allreduce (f32 sum) timing, the MPI column of bench/compare_allreduce.sh.
//
// Usage: mpi_allreduce [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
//                      [-m out|in]
// Sizes take K/M/G suffixes (powers of 1024). For every size from MINBYTES to MAXBYTES
// (multiplied by FACTOR each step) it runs WARMUP allreduces, then a barrier, then
// ITERS back-to-back MPI_Allreduce calls; the time per op is the average, taken as the
// maximum over ranks. -m out (the default): from a send buffer into a receive buffer;
// -m in: MPI_IN_PLACE on one buffer, each op reducing what the one before wrote (no
// input is restored between timed ops, which would time a copy with them; the values
// double each op on 2 ranks and reach inf after about 125 ops, which costs a float
// addition nothing). Rank 0 prints one
// machine-readable line per size:
//   size_bytes time_us wrong_elements
// Lines starting with '#' are comments. Inputs are rank+1 on every element, so every
// output element must equal size*(size+1)/2 (exact in f32 for small worlds); the check
// runs one more op (in place: on freshly filled input) after the timed ones.
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  size_t min_bytes, max_bytes, factor;
  int iters, warmup;
  int in_place;
} Options;

static size_t parse_size(const char* opt, const char* text) {
  char* end = NULL;
  unsigned long long v = strtoull(text, &end, 10);
  size_t mult = 1;
  if (end == text) goto bad;
  if (*end == 'K' || *end == 'k') mult = 1024ull, ++end;
  else if (*end == 'M' || *end == 'm') mult = 1024ull * 1024, ++end;
  else if (*end == 'G' || *end == 'g') mult = 1024ull * 1024 * 1024, ++end;
  if (*end != '\0') goto bad;
  return (size_t)v * mult;
bad:
  fprintf(stderr, "mpi_allreduce: bad value '%s' for %s\n", text, opt);
  exit(2);
}

static Options parse_options(int argc, char** argv) {
  Options o = {8, 256ull << 20, 2, 20, 5, 0};
  int c;
  while ((c = getopt(argc, argv, "b:e:f:n:w:m:")) != -1) {
    switch (c) {
      case 'b': o.min_bytes = parse_size("-b", optarg); break;
      case 'e': o.max_bytes = parse_size("-e", optarg); break;
      case 'f': o.factor = parse_size("-f", optarg); break;
      case 'n': o.iters = (int)parse_size("-n", optarg); break;
      case 'w': o.warmup = (int)parse_size("-w", optarg); break;
      case 'm':
        if (strcmp(optarg, "in") != 0 && strcmp(optarg, "out") != 0) {
          fprintf(stderr, "mpi_allreduce: -m must be out or in, not '%s'\n", optarg);
          exit(2);
        }
        o.in_place = strcmp(optarg, "in") == 0;
        break;
      default: exit(2);
    }
  }
  if (o.factor < 2 || o.iters < 1 || o.min_bytes < 4 || o.min_bytes > o.max_bytes) {
    fprintf(stderr, "mpi_allreduce: need -f >= 2, -n >= 1, 4 <= -b <= -e\n");
    exit(2);
  }
  return o;
}

// Average seconds per allreduce of `count` floats on this rank; send is MPI_IN_PLACE in
// place.
static double time_allreduce(const void* send, float* recv, size_t count, const Options* o) {
  for (int i = 0; i < o->warmup; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < o->iters; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return (MPI_Wtime() - start) / o->iters;
}

static void fill(float* buf, size_t count, float value) {
  for (size_t i = 0; i < count; ++i) buf[i] = value;
}

static long count_wrong(const float* recv, size_t count, int world) {
  const float expected = (float)world * (float)(world + 1) / 2.0f;
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += recv[i] != expected;
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Options o = parse_options(argc, argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  size_t max_count = o.max_bytes / sizeof(float);
  float* send = malloc(max_count * sizeof(float) + 1);
  float* recv = malloc(max_count * sizeof(float) + 1);
  if (!send || !recv) {
    fprintf(stderr, "mpi_allreduce: out of memory for %zu bytes\n", o.max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  fill(send, max_count, (float)(rank + 1));
  fill(recv, max_count, (float)(rank + 1));
  const void* source = o.in_place ? MPI_IN_PLACE : (const void*)send;
  if (rank == 0)
    printf("# mpi allreduce f32 sum, %d ranks, %s: size_bytes time_us wrong\n", world,
           o.in_place ? "in place" : "out of place");
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.factor) {
    size_t count = bytes / sizeof(float);
    double local = time_allreduce(source, recv, count, &o), slowest = 0;
    // The check: one more op on fresh input (in place) or into a zeroed buffer.
    if (o.in_place) fill(recv, count, (float)(rank + 1));
    else memset(recv, 0, count * sizeof(float));
    MPI_Allreduce(source, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long wrong = count_wrong(recv, count, world), total_wrong = 0;
    MPI_Reduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("%zu %.3f %ld\n", count * sizeof(float), slowest * 1e6, total_wrong);
    fflush(stdout);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return 0;
}
