// hash_bucket.cu: deterministic 64-bit hashing of int64 keys into [0, num_buckets).
//
// h = splitmix64_finalizer(key XOR seed); bucket = ((h >> 32) * num_buckets) >> 32
// (multiply-shift range reduction: no division, identical on CPU and GPU; num_buckets < 2^32).
// The NumPy twin in hash_bucket.py computes the same bits.
//
// Macros injected by the host: none.
// Launch geometry: 1-D, blockDim.x = 256, gridDim.x = min(ceil(n / 256), 65535), grid-stride loop.

extern "C" __global__ void hash_bucket(const long long* __restrict__ keys, long long* __restrict__ out,
                                       const long long n, const unsigned long long seed,
                                       const unsigned long long num_buckets) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long z = ((unsigned long long)keys[i]) ^ seed;
        z += 0x9E3779B97F4A7C15ULL;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        z ^= z >> 31;
        out[i] = (long long)(((z >> 32) * num_buckets) >> 32);
    }
}
