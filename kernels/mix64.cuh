// mix64.cuh: the splitmix64 finalizer of the kernels of this package (hash_bucket.cu).
// Its NumPy twin is kernels.hashing.mix64.
#pragma once

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
