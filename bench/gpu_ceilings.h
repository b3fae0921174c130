// The two ceilings every GPU figure is reported against, measured in the same run:
// HBM bandwidth (a large device-to-device copy) and the bf16 tensor-core rate (a large GEMM).
#pragma once

namespace kiln::bench {

double measure_copy_gbps(double gib);                  // bytes read + written per second / 1e9
double measure_bf16_gemm_tflops(int m, int n, int k);  // 2mnk / s / 1e12

}  // namespace kiln::bench
