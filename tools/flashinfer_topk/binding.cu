// Our C entry to FlashInfer's ragged top-k (include/flashinfer/topk.cuh, staged by
// tools/stage_flashinfer_topk.sh, never committed): raw pointers and the caller's stream, so the
// build needs nvcc and the staged headers only; flashinfer_topk_staged.py calls it through ctypes.
//
// TopKRaggedTransformDispatch is FlashInfer's own dispatch for that op (its filtered one-CTA-a-row
// kernel or its multi-CTA radix kernel, by FlashInfer's heuristic on rows, k and width), called
// as its top_k_ragged_transform wrapper calls it on sm_90: not deterministic, no tie-break. Each
// row r sees positions < lengths[r]; with zero offsets the indices it writes are positions in the
// row, -1 past a row shorter than k.
#include <cstdint>
#include <cstring>  // topk.cuh calls std::strcmp (its FLASHINFER_TOPK_ALGO override) and includes <cstdlib> only
#include <exception>
#include <string>

// topk.cuh calls flashinfer::math without including math.cuh (FlashInfer's sources include
// sampling.cuh, which includes both); the stager copies every <flashinfer/...> named here.
#include <flashinfer/math.cuh>
#include <flashinfer/topk.cuh>

// Which parameters the staged revision's dispatch takes (build.py, from manifest.json).
#ifndef FI_TOPK_ROW_STARTS
#define FI_TOPK_ROW_STARTS 0
#endif
#ifndef FI_TOPK_DETERMINISTIC
#define FI_TOPK_DETERMINISTIC 0
#endif
#ifndef FI_TOPK_TIE_BREAK
#define FI_TOPK_TIE_BREAK 0
#endif

namespace {

namespace sampling = flashinfer::sampling;

// A failure other than a CUDA error code (a bad argument, an exception from the headers), read
// back with fi_topk_last_error; the entry returns -1 then.
thread_local std::string last_error;

int fail(const std::string& message) {
  last_error = message;
  return -1;
}

cudaError_t dispatch(float* logits, int32_t* lengths, const int32_t* offsets, int32_t* out, uint32_t rows,
                     uint32_t k, uint32_t width, sampling::RadixRowState* row_states, cudaStream_t stream) {
  return sampling::TopKRaggedTransformDispatch<float, int32_t>(logits, out, offsets, lengths,
#if FI_TOPK_ROW_STARTS
                                                               /*row_starts=*/nullptr,
#endif
                                                               rows, k, width, row_states,
#if FI_TOPK_DETERMINISTIC
                                                               /*deterministic=*/false,
#endif
#if FI_TOPK_TIE_BREAK
                                                               sampling::TopKTieBreak::None,
#endif
                                                               stream);
}

}  // namespace

extern "C" {

// Top-k of each fp32 row of logits [rows, width] (row stride in elements) over its first lengths[r]
// positions, into out [rows, k] (int32, contiguous). offsets: int32 [rows], added to each index
// (zeros: positions). row_states: FlashInfer's RadixRowState buffer (zeroed once, 1 MiB as its
// wrapper allocates; its multi-CTA kernel leaves it zeroed). Returns 0, a cudaError_t, or -1.
int fi_topk_ragged_transform_f32(const float* logits, int64_t rows, int64_t width, int64_t row_stride,
                                 const int32_t* lengths, const int32_t* offsets, int32_t* out, int64_t k,
                                 void* row_states, int device, void* stream) {
  // The ragged transform reads row r at logits + r * width: it takes no stride of its own.
  if (row_stride != width) {
    return fail("row_stride: FlashInfer's ragged transform reads rows at the row width " + std::to_string(width) +
                ", got a stride of " + std::to_string(row_stride));
  }
  if (rows < 1 || rows > INT32_MAX || width < 1 || width > INT32_MAX || k < 1 || k > INT32_MAX) {
    return fail("rows, width, k: expected 1..2^31-1, got " + std::to_string(rows) + ", " +
                std::to_string(width) + ", " + std::to_string(k));
  }
  int current = -1;
  cudaError_t status = cudaGetDevice(&current);
  if (status != cudaSuccess) return status;
  // FlashInfer's dispatch reads the current device's SM count and shared memory size.
  if (current != device && (status = cudaSetDevice(device)) != cudaSuccess) return status;
  try {
    status = dispatch(const_cast<float*>(logits), const_cast<int32_t*>(lengths), offsets, out,
                      static_cast<uint32_t>(rows), static_cast<uint32_t>(k), static_cast<uint32_t>(width),
                      static_cast<sampling::RadixRowState*>(row_states), static_cast<cudaStream_t>(stream));
  } catch (const std::exception& exc) {
    if (current != device) cudaSetDevice(current);
    return fail(std::string("TopKRaggedTransformDispatch: ") + exc.what());
  }
  if (current != device) cudaSetDevice(current);
  return status;
}

const char* fi_topk_error_string(int code) {
  return code == -1 ? last_error.c_str() : cudaGetErrorString(static_cast<cudaError_t>(code));
}

// sizeof(RadixRowState): the wrapper checks its buffer holds one for every SM (a group at most each).
int64_t fi_topk_row_state_bytes() { return static_cast<int64_t>(sizeof(sampling::RadixRowState)); }

}  // extern "C"
