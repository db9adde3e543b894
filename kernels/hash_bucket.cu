// hash_bucket.cu: deterministic 64-bit hashing of int64 keys into [0, num_buckets).
//
// h = splitmix64_finalizer(key XOR seed); bucket = ((h >> 32) * num_buckets) >> 32
// (multiply-shift range reduction: no division, identical on CPU and GPU; num_buckets < 2^32).
// The NumPy twin in hash_bucket.py computes the same bits.
//
// Includes mix64.cuh (the host passes -I<kernels dir>). Macros injected by the host: none.
// Launch geometry: 1-D, blockDim.x = 256, gridDim.x = min(ceil(n / 256), 65535), grid-stride loop.

#include "mix64.cuh"

extern "C" __global__ void hash_bucket(const long long* __restrict__ keys, long long* __restrict__ out,
                                       const long long n, const unsigned long long seed,
                                       const unsigned long long num_buckets) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned long long z = mix64(((unsigned long long)keys[i]) ^ seed);
        out[i] = (long long)(((z >> 32) * num_buckets) >> 32);
    }
}
