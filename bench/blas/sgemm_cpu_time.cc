// fp32 GEMM rate per CPU second of the two BLAS-like libraries a Debian build of the engine has at
// hand: OpenBLAS (Fortran sgemm_, what libtorch 1.13's matmuls call) and oneDNN (dnnl_sgemm; libdnnl2
// is a dependency of Debian's libtorch), on the small Qwen3 bench model's training products (1,024
// rows: forward, dX and dW) and decode products (64 rows). CPU time, not wall time: at one thread a
// process waiting for a shared core spends none, so the rate is each library's own kernel rate, the
// same on a loaded machine as on a quiet one. Built and run by bench/blas/run.sh; the PyTorch side of
// the same products is bench/blas/sgemm_cpu_time_torch.py.
#include <omp.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*);
void openblas_set_num_threads(int);
int dnnl_sgemm(char, char, long, long, long, float, const float*, long, const float*, long, float, float*, long);
}

namespace {

double cpuNow() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Row-major C [M, N] = op(A) op(B); ta: A stored [K, M]; tb: B stored [N, K].
void openblas(char ta, char tb, int M, int N, int K, const float* A, const float* B, float* C) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
  const float one = 1, zero = 0;
  const int lda = ta == 'T' ? M : K, ldb = tb == 'T' ? K : N, ldc = N;
  sgemm_(&tb, &ta, &N, &M, &K, &one, B, &ldb, A, &lda, &zero, C, &ldc);
}
void onednn(char ta, char tb, int M, int N, int K, const float* A, const float* B, float* C) {
  dnnl_sgemm(ta, tb, M, N, K, 1.f, A, ta == 'T' ? M : K, B, tb == 'T' ? K : N, 0.f, C, N);
}

struct Shape {
  const char* name;
  char ta, tb;
  int M, N, K;
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
  const Shape shapes[] = {{"fwd q/k/v", 'N', 'T', 1024, 1024, 512},   {"fwd o", 'N', 'T', 1024, 512, 512},
                          {"fwd gate/up", 'N', 'T', 1024, 2560, 512}, {"fwd down", 'N', 'T', 1024, 512, 1280},
                          {"dX gate/up", 'N', 'N', 1024, 512, 2560},  {"dW gate/up", 'T', 'N', 2560, 512, 1024},
                          {"dX down", 'N', 'N', 1024, 1280, 512},     {"dW down", 'T', 'N', 512, 1280, 1024},
                          {"decode q/k/v", 'N', 'T', 64, 1024, 512},  {"decode gate/up", 'N', 'T', 64, 2560, 512}};
  std::printf("%d thread(s); GFLOP per CPU second\n| product | M | N | K | OpenBLAS | oneDNN | oneDNN / OpenBLAS |\n"
              "|---|---:|---:|---:|---:|---:|---:|\n",
              threads);
  for (const Shape& s : shapes) {
    std::vector<float> A(size_t(s.M) * s.K), B(size_t(s.N) * s.K), C(size_t(s.M) * s.N);
    for (float& x : A) x = float(std::rand()) / float(RAND_MAX) - 0.5f;
    for (float& x : B) x = float(std::rand()) / float(RAND_MAX) - 0.5f;
    double rate[2];
    for (int lib = 0; lib < 2; lib++) {
      auto run = lib == 0 ? openblas : onednn;
      for (int i = 0; i < 3; i++) run(s.ta, s.tb, s.M, s.N, s.K, A.data(), B.data(), C.data());  // warm-up
      int iters = 0;
      const double t0 = cpuNow();
      double spent = 0;
      do {
        run(s.ta, s.tb, s.M, s.N, s.K, A.data(), B.data(), C.data());
        iters++;
        spent = cpuNow() - t0;
      } while (spent < 1.0);
      rate[lib] = 2.0 * s.M * s.N * s.K * iters / spent / 1e9;
    }
    std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.2fx |\n", s.name, s.M, s.N, s.K, rate[0], rate[1],
                rate[1] / rate[0]);
  }
}
