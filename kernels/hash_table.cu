// hash_table.cu: an open-addressing (linear probing) map from int64 keys to int64 values.
//
// Slot s holds table_keys[s], table_values[s] and state[s] (0 empty, 1 being written, 2 full).
// Any int64 is a valid key: emptiness lives in `state`, not in a sentinel key. The start slot
// of a key is mix64(key) & mask (capacity is a power of two), as in the NumPy twin
// (kernels/hash_table.py), so both place keys identically.
//
// Includes mix64.cuh (the host passes -I<kernels dir>). Macros injected by the host: none.
// Launch geometry: 1-D, blockDim.x = 256, gridDim.x = min(ceil(n / 256), 65535), grid-stride loop.
// The host keeps the load factor at most 1/2 (it grows the table first), so probes terminate.

#include "mix64.cuh"

#define EMPTY 0
#define BUSY 1
#define FULL 2

extern "C" __global__ void lookup(const long long* __restrict__ table_keys,
                                  const long long* __restrict__ table_values,
                                  const int* __restrict__ state, const unsigned long long mask,
                                  const long long* __restrict__ keys, long long* __restrict__ out,
                                  const long long n) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long key = keys[i];
        unsigned long long s = mix64((unsigned long long)key) & mask;
        long long found = -1;
        while (true) {
            const int st = state[s];
            if (st == EMPTY) break;
            if (st == FULL && table_keys[s] == key) { found = table_values[s]; break; }
            s = (s + 1) & mask;
        }
        out[i] = found;
    }
}

// Inserts (key, value) pairs; an existing key gets the new value. Keys must be unique within
// one launch (the host deduplicates), so two threads never race on the same key.
extern "C" __global__ void insert(long long* __restrict__ table_keys, long long* __restrict__ table_values,
                                  int* __restrict__ state, const unsigned long long mask,
                                  const long long* __restrict__ keys, const long long* __restrict__ values,
                                  const long long n, unsigned long long* __restrict__ inserted) {
    const long long stride = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long key = keys[i];
        unsigned long long s = mix64((unsigned long long)key) & mask;
        while (true) {
            int st = atomicCAS(&state[s], EMPTY, BUSY);
            if (st == EMPTY) {  // claimed: publish key and value, then mark full
                table_keys[s] = key;
                table_values[s] = values[i];
                __threadfence();
                atomicExch(&state[s], FULL);
                atomicAdd(inserted, 1ULL);
                break;
            }
            while (st == BUSY) st = atomicAdd(&state[s], 0);  // another key is being written here
            if (table_keys[s] == key) { table_values[s] = values[i]; break; }
            s = (s + 1) & mask;
        }
    }
}
