// Comm (MPI backend) collectives at np 1, 2, 4: raw buffers, every dtype the backend
// reduces, tensors through comm_tensor.h, and byte strings.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <slimpi/error.h>

#include <cstring>
#include <numeric>

#include "parallel/comm_tensor.h"
#include "parallel/mpi_comm.h"

namespace slimpi {
namespace {

class CommTest : public ::testing::Test {
 protected:
  MpiComm comm{MPI_COMM_WORLD, "test"};
  int r = comm.rank();
  int n = comm.size();
};

TEST_F(CommTest, AllreduceSumMaxMinF32F64I64) {
  std::vector<float> f(1000);
  std::vector<double> d(1000);
  std::vector<int64_t> i(1000);
  for (int k = 0; k < 1000; ++k) {
    f[k] = float(k + r);
    d[k] = 0.5 * k * (r + 1);
    i[k] = int64_t(k) * 1000000000LL + r;
  }
  comm.allreduce(f.data(), f.size(), DType::F32, ReduceOp::Sum);
  comm.allreduce(d.data(), d.size(), DType::F64, ReduceOp::Max);
  comm.allreduce(i.data(), i.size(), DType::I64, ReduceOp::Min);
  const int rank_sum = n * (n - 1) / 2;
  for (int k = 0; k < 1000; ++k) {
    ASSERT_EQ(f[k], float(n * k + rank_sum));
    ASSERT_EQ(d[k], 0.5 * k * n);
    ASSERT_EQ(i[k], int64_t(k) * 1000000000LL);
  }
}

TEST_F(CommTest, AllreduceBf16SumsInFloatAndRounds) {
  at::Tensor t = at::full({64}, 0.5 + r, at::kBFloat16);  // exactly representable
  allreduce(comm, t);
  const float expected = 0.5f * n + n * (n - 1) / 2.0f;
  EXPECT_TRUE(at::equal(t, at::full({64}, expected, at::kBFloat16)));
  at::Tensor h = at::ones({4}, at::kHalf);
  EXPECT_THROW(allreduce(comm, h), Error);  // fp16 sums are not supported on MPI
}

TEST_F(CommTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < n; ++root) {
    at::Tensor t = r == root ? at::arange(100, at::kFloat) * (root + 1) : at::zeros({100}, at::kFloat);
    broadcast(comm, t, root);
    EXPECT_TRUE(at::equal(t, at::arange(100, at::kFloat) * (root + 1))) << "root " << root;
  }
}

TEST_F(CommTest, AllgatherStacksInRankOrder) {
  at::Tensor mine = at::full({2, 3}, r, at::kLong);
  at::Tensor all = allgather(comm, mine);  // [n, 2, 3]
  ASSERT_EQ(all.sizes(), (std::vector<int64_t>{n, 2, 3}));
  for (int k = 0; k < n; ++k) EXPECT_TRUE(at::equal(all[k], at::full({2, 3}, k, at::kLong)));
}

// Reduce-scatter (blocking and not) and all-gather, out of place and in place (recv =
// this rank's block of send; send = this rank's block of recv), as the distributed
// optimizer runs them over its gradient buffer.
TEST_F(CommTest, ReduceScatterAndAllgatherInPlace) {
  const size_t count = 5;
  auto blocks = [&] {  // rank r's send: block p holds 100 p + 10 r + i
    std::vector<float> v(count * size_t(n));
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) v[size_t(p) * count + i] = float(100 * p + 10 * r + int(i));
    return v;
  };
  auto expect_sums = [&](const float* got, const std::string& how) {
    for (size_t i = 0; i < count; ++i)
      EXPECT_EQ(got[i], float(n * (100 * r + int(i)) + 10 * n * (n - 1) / 2)) << how << " element " << i;
  };
  std::vector<float> send = blocks(), out(count);
  comm.reduce_scatter(send.data(), out.data(), count, DType::F32);
  expect_sums(out.data(), "out of place");
  std::vector<float> in_place = blocks();
  comm.reduce_scatter(in_place.data(), in_place.data() + size_t(r) * count, count, DType::F32);
  expect_sums(in_place.data() + size_t(r) * count, "in place");
  std::vector<float> pending_buf = blocks();
  auto pending = comm.ireduce_scatter(pending_buf.data(), pending_buf.data() + size_t(r) * count, count, DType::F32);
  pending->wait();
  expect_sums(pending_buf.data() + size_t(r) * count, "in place, non-blocking");
  std::vector<float> gathered(count * size_t(n), -1.0f);
  for (size_t i = 0; i < count; ++i) gathered[size_t(r) * count + i] = float(r * 10 + int(i));
  comm.allgather(gathered.data() + size_t(r) * count, gathered.data(), count, DType::F32);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(gathered[size_t(p) * count + i], float(p * 10 + int(i)));
}

TEST_F(CommTest, SendRecvRing) {
  if (n < 2) GTEST_SKIP() << "needs a peer";
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  at::Tensor out = at::full({1000}, float(r), at::kFloat);
  at::Tensor in = at::empty({1000}, at::kFloat);
  // Even ranks send first, odd ranks receive first: no deadlock with blocking calls.
  if (r % 2 == 0) {
    send(comm, out, next);
    recv(comm, in, prev);
  } else {
    recv(comm, in, prev);
    send(comm, out, next);
  }
  EXPECT_TRUE(at::equal(in, at::full({1000}, float(prev), at::kFloat)));
}

TEST_F(CommTest, AlltoallvRowsWithUnevenAndEmptyBlocks) {
  // Rank r sends (r + p) % 3 rows to rank p (some blocks empty), each row [r, p, j, j].
  std::vector<int64_t> send_rows(n), recv_rows(n);
  std::vector<float> values;
  for (int p = 0; p < n; ++p) {
    send_rows[p] = (r + p) % 3;
    recv_rows[p] = (p + r) % 3;
    for (int64_t j = 0; j < send_rows[p]; ++j) values.insert(values.end(), {float(r), float(p), float(j), float(j)});
  }
  at::Tensor send = at::tensor(values, at::kFloat).view({-1, 4});  // [Σ send_rows, 4]
  if (values.empty()) send = at::empty({0, 4});
  at::Tensor got = alltoallv_rows(comm, send, send_rows, recv_rows);
  ASSERT_EQ(got.size(0), std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0}));
  ASSERT_EQ(got.size(1), 4);
  int64_t row = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < recv_rows[p]; ++j, ++row) {
      EXPECT_EQ(got[row][0].item<float>(), float(p));  // from rank p, for this rank, its j-th row
      EXPECT_EQ(got[row][1].item<float>(), float(r));
      EXPECT_EQ(got[row][2].item<float>(), float(j));
    }
  EXPECT_THROW(alltoallv_rows(comm, send, std::vector<int64_t>(n + 1, 0), recv_rows), Error);
}

TEST_F(CommTest, ByteStrings) {
  std::string text = r == 0 ? std::string("deck text with \0 inside", 23) : "";
  broadcast_bytes(comm, text, 0);
  EXPECT_EQ(text, std::string("deck text with \0 inside", 23));
  if (n < 2) return;
  if (r == 0) send_bytes(comm, std::string(100000, 'x'), 1);
  if (r == 1) EXPECT_EQ(recv_bytes(comm, 0), std::string(100000, 'x'));
}

TEST_F(CommTest, NonContiguousTensorsAreRefused) {
  at::Tensor t = at::zeros({4, 4}, at::kFloat).t();
  EXPECT_THROW(allreduce(comm, t), Error);
}

TEST_F(CommTest, BarrierAndBigBuffersReuseTheCallersMemory) {
  comm.barrier();
  // 16 MB in place: the result lands in the caller's buffer, no copy is returned.
  at::Tensor big = at::ones({4 << 20}, at::kFloat);
  void* before = big.data_ptr();
  allreduce(comm, big);
  EXPECT_EQ(big.data_ptr(), before);
  EXPECT_EQ(big[12345].item<float>(), float(n));
}

}  // namespace
}  // namespace slimpi
