// kiln doctor's parts without a cluster: the facts survive their encoding exactly, and each check
// of facts gives its ok, warn and fail from made-up ranks (tests/train/test_doctor.sh runs the
// whole command under mpirun).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/json_writer.h"
#include "launch/doctor/checks.h"
#include "launch/doctor/facts.h"
#include "launch/doctor/probes.h"
#include "launch/doctor/report.h"

namespace kiln::launch::doctor {
namespace {

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" lacks \"" << part << "\"";
}

// A rank with a GPU of its own, NVML readings, one network interface and, on a host's first
// rank, peer access and a fast write test.
RankFacts gpu_rank(int rank, const std::string& host, int local_rank, int local_size,
                   const std::string& bus_id) {
  RankFacts f;
  f.rank = rank;
  f.host = host;
  f.local_rank = local_rank;
  f.local_size = local_size;
  f.gpu_count = local_size;
  f.gpu = GpuFacts{local_rank, "NVIDIA H100", bus_id, true, "ok", 41, 71.5, 700, 1980, 1980};
  f.interfaces = {{"eth0", "10.0.0.1", true}, {"lo", "127.0.0.1", true}};
  f.nccl_interface = "eth0";
  if (local_rank == 0) {
    f.peer_access = PeerAccessFacts{local_size * (local_size - 1), local_size * (local_size - 1),
                                    "NVIDIA H100, NVIDIA H100"};
    f.write = WriteResult{"/ckpt", 128.0 * (1 << 20), 0.25, ""};
  }
  return f;
}

std::vector<RankFacts> one_host_two_gpus() {
  return {gpu_rank(0, "node1", 0, 2, "0000:01:00.0"), gpu_rank(1, "node1", 1, 2, "0000:41:00.0")};
}

Check run(const std::string& name, const std::vector<RankFacts>& ranks,
          const DoctorOptions& options = {}) {
  return run_check(fact_check(name), job_facts(ranks, 0, options), options);
}

void expect_same(const RankFacts& a, const RankFacts& b) {
  EXPECT_EQ(encode(a), encode(b));  // numbers compared by their bytes, NaN included
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.local_rank, b.local_rank);
  EXPECT_EQ(a.local_size, b.local_size);
  EXPECT_EQ(a.gpu_count, b.gpu_count);
  ASSERT_EQ(a.gpu.has_value(), b.gpu.has_value());
  if (a.gpu) {
    EXPECT_EQ(a.gpu->name, b.gpu->name);
    EXPECT_EQ(a.gpu->pci_bus_id, b.gpu->pci_bus_id);
    EXPECT_EQ(a.gpu->nvml, b.gpu->nvml);
    EXPECT_EQ(a.gpu->power_w, b.gpu->power_w);
  }
  ASSERT_EQ(a.peer_access.has_value(), b.peer_access.has_value());
  ASSERT_EQ(a.interfaces.size(), b.interfaces.size());
  EXPECT_EQ(interface_list(a.interfaces), interface_list(b.interfaces));
  EXPECT_EQ(a.nccl_socket_ifname, b.nccl_socket_ifname);
  EXPECT_EQ(a.nccl_p2p_disable, b.nccl_p2p_disable);
  EXPECT_EQ(a.nccl_ib_disable, b.nccl_ib_disable);
  ASSERT_EQ(a.write.has_value(), b.write.has_value());
  if (a.write) {
    EXPECT_EQ(a.write->seconds, b.write->seconds);
    EXPECT_EQ(a.write->error, b.write->error);
  }
}

TEST(DoctorFacts, RoundTripKeepsEveryFieldAndNumberExactly) {
  RankFacts f = gpu_rank(3, "node=2\nwith newline", 0, 4, "0000:c1:00.0");
  f.gpu->power_w = 71.234567890123456;  // more digits than any printf the report uses
  f.gpu->temperature_c = std::numeric_limits<double>::quiet_NaN();
  f.gpu->sm_clock_mhz = std::numeric_limits<double>::infinity();
  f.write->seconds = 1e-300;
  f.write->error = std::string("a\0b", 3);
  f.interfaces.push_back({"ib0", "fe80::1", false});
  f.nccl_socket_ifname = "";  // set but empty: not the same as unset
  f.nccl_ib_disable = "1";
  const RankFacts back = decode(encode(f));
  expect_same(f, back);
  EXPECT_EQ(back.host, "node=2\nwith newline");
  EXPECT_EQ(back.gpu->power_w, 71.234567890123456);
  EXPECT_TRUE(std::isnan(back.gpu->temperature_c));
  EXPECT_EQ(back.write->seconds, 1e-300);
  EXPECT_EQ(back.write->error.size(), 3u);
  EXPECT_EQ(back.peer_access->pairs, 12);
  EXPECT_FALSE(back.interfaces.back().up);
  ASSERT_TRUE(back.nccl_socket_ifname.has_value());
  EXPECT_EQ(*back.nccl_socket_ifname, "");
  EXPECT_FALSE(back.nccl_p2p_disable.has_value());
}

TEST(DoctorFacts, RoundTripOfARankWithoutGpuOrWriteTest) {
  RankFacts f;
  f.rank = 1;
  f.host = "cpu-node";
  const RankFacts back = decode(encode(f));
  expect_same(f, back);
  EXPECT_FALSE(back.gpu || back.peer_access || back.write);
}

TEST(DoctorFacts, DecodeRefusesBytesItDidNotWrite) {
  const std::string bytes = encode(gpu_rank(0, "node1", 0, 1, "0000:01:00.0"));
  EXPECT_THROW(decode(bytes.substr(0, bytes.size() - 1)), Error);
  EXPECT_THROW(decode(bytes + "x"), Error);
  EXPECT_THROW(decode("rank=0\nhost=node1\n"), Error);
  EXPECT_THROW(decode(""), Error);
}

TEST(DoctorChecks, UnknownCheckNamesTheKnownOnes) {
  try {
    fact_check("disks");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "world, peer_access, network, checkpoint_write, gpu_health"));
  }
}

TEST(DoctorChecks, WorldOkWithOneGpuPerRank) {
  Check c = run("world", one_host_two_gpus());
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail, "2 ranks on 1 host; one GPU per rank");
  EXPECT_EQ(c.fix, "nothing to do");
  EXPECT_TRUE(gpus_usable(job_facts(one_host_two_gpus(), 0, {}), c));
}

TEST(DoctorChecks, WorldOnTheCpuIsOk) {
  DoctorOptions cpu;
  cpu.use_cuda = false;
  Check c = run("world", one_host_two_gpus(), cpu);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail, "2 ranks on 1 host, on the CPU");
}

TEST(DoctorChecks, WorldFailsWhenTwoRanksShareAGpu) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[1].gpu->pci_bus_id = ranks[0].gpu->pci_bus_id;
  Check c = run("world", ranks);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(contains(c.detail, "ranks 0, 1 share one GPU (host and PCI bus id node1 0000:01"));
  EXPECT_TRUE(contains(c.fix, "one rank per GPU"));
  EXPECT_FALSE(gpus_usable(job_facts(ranks, 0, {}), c));
  // The same bus id on two hosts is two GPUs.
  ranks[1].host = "node2";
  EXPECT_EQ(run("world", ranks).verdict, Verdict::Ok);
}

TEST(DoctorChecks, WorldFailsForARankWithoutAGpu) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[1].gpu.reset();
  Check c = run("world", ranks);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(contains(c.detail,
                       "rank 1 on node1 has no GPU of its own (local rank 1 of 2, 2 "
                       "GPUs visible)"));
}

// A CUDA build asked for GPUs (--device auto) where no rank sees one: not a CPU job that passes.
TEST(DoctorChecks, WorldFailsOnACudaBuildWhereNoGpuIsUsable) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  for (RankFacts& f : ranks) {
    f.gpu.reset();
    f.gpu_count = 0;
  }
  DoctorOptions options;
  options.cuda_build = true;
  Check c = run("world", ranks, options);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(contains(c.detail, "rank 0 on node1 sees no usable GPU")) << c.detail;
  EXPECT_TRUE(contains(c.fix, "kiln doctor --device cpu")) << c.fix;
  EXPECT_FALSE(gpus_usable(job_facts(ranks, 0, options), c));
  // --device cpu on the same build, or a CPU build: a CPU job, which is fine.
  options.use_cuda = false;
  EXPECT_EQ(run("world", ranks, options).verdict, Verdict::Ok);
  options.use_cuda = true;
  options.cuda_build = false;
  EXPECT_EQ(run("world", ranks, options).verdict, Verdict::Ok);
}

TEST(DoctorChecks, PeerAccessOkWithAccessOrWithoutGpus) {
  Check c = run("peer_access", one_host_two_gpus());
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail, "node1: 2 GPU(s), peer access on 2 of 2 directed pairs");
  DoctorOptions cpu;
  cpu.use_cuda = false;
  c = run("peer_access", one_host_two_gpus(), cpu);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail, "no GPU");
  EXPECT_EQ(c.fix, "nothing to do");
}

TEST(DoctorChecks, PeerAccessMissingOnRtx4090sIsNormal) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].peer_access = PeerAccessFacts{2, 0, "NVIDIA GeForce RTX 4090, NVIDIA GeForce RTX 4090"};
  Check c = run("peer_access", ranks);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_TRUE(contains(c.detail,
                       "no peer access between them: NCCL goes through host memory "
                       "(normal for RTX 4090s"));
}

TEST(DoctorChecks, PeerAccessWarnsWhen4090sReportSome) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].peer_access = PeerAccessFacts{2, 2, "NVIDIA GeForce RTX 4090, NVIDIA GeForce RTX 4090"};
  Check c = run("peer_access", ranks);
  EXPECT_EQ(c.verdict, Verdict::Warn);
  EXPECT_TRUE(contains(c.fix, "set NCCL_P2P_DISABLE=1"));
}

TEST(DoctorChecks, PeerAccessWarnsWhenP2pDisableTurnsWorkingAccessOff) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].nccl_p2p_disable = "1";
  Check c = run("peer_access", ranks);
  EXPECT_EQ(c.verdict, Verdict::Warn);
  EXPECT_TRUE(contains(c.detail, "; NCCL_P2P_DISABLE=1"));
  EXPECT_TRUE(contains(c.fix, "unset it unless peer-to-peer is broken"));
}

TEST(DoctorChecks, NetworkOkNamesTheLikelyInterface) {
  Check c = run("network", one_host_two_gpus());
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail,
            "node1: NCCL would likely use eth0 (interfaces: eth0 10.0.0.1, lo 127.0.0.1)");
  DoctorOptions cpu;
  cpu.use_cuda = false;
  EXPECT_TRUE(
      contains(run("network", one_host_two_gpus(), cpu).detail, "NCCL is not used on the CPU"));
}

TEST(DoctorChecks, NetworkFailsWhenSocketIfnameMatchesNothing) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].nccl_socket_ifname = "enp9";
  ranks[0].nccl_interface = "";
  Check c = run("network", ranks);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_TRUE(contains(c.detail, "node1: NCCL_SOCKET_IFNAME=enp9 -> no interface"));
  EXPECT_TRUE(contains(c.fix, "NCCL_SOCKET_IFNAME=enp9 matches no interface that is up on node1"));
}

TEST(DoctorChecks, NetworkWarnsOnLoopbackAcrossHosts) {
  std::vector<RankFacts> ranks = {gpu_rank(0, "node1", 0, 1, "0000:01:00.0"),
                                  gpu_rank(1, "node2", 0, 1, "0000:01:00.0")};
  ranks[1].nccl_interface = "lo";
  Check c = run("network", ranks);
  EXPECT_EQ(c.verdict, Verdict::Warn);
  EXPECT_TRUE(contains(c.fix,
                       "node2 has only the loopback interface for NCCL, yet the ranks "
                       "span 2 hosts"));
  // On one host, loopback is all NCCL needs.
  ranks.pop_back();
  ranks[0].nccl_interface = "lo";
  EXPECT_EQ(run("network", ranks).verdict, Verdict::Ok);
}

TEST(DoctorChecks, WriteOkOnAFastDisk) {
  Check c = run("checkpoint_write", one_host_two_gpus());
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_EQ(c.detail, "node1: /ckpt 537 MB/s (128 MiB written and fsynced)");
  ASSERT_TRUE(c.data);
  JsonWriter j;
  j.begin_object();
  c.data(j);
  j.end_object();
  EXPECT_TRUE(contains(j.str(), "\"host\":\"node1\",\"dir\":\"/ckpt\",\"bytes\":134217728"));
}

TEST(DoctorChecks, WriteWarnsOnASlowDisk) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].write->seconds = 10;  // 13 MB/s
  Check c = run("checkpoint_write", ranks);
  EXPECT_EQ(c.verdict, Verdict::Warn);
  EXPECT_TRUE(contains(c.detail, "/ckpt 13 MB/s"));
  EXPECT_TRUE(contains(c.fix, "node1: /ckpt writes below 200 MB/s: checkpoints will stall"));
}

TEST(DoctorChecks, WriteFailsNamingTheDirectory) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].write = WriteResult{"/nonexistent", 0, 0, "the directory /nonexistent does not exist"};
  Check c = run("checkpoint_write", ranks);
  EXPECT_EQ(c.verdict, Verdict::Fail);
  EXPECT_EQ(c.detail, "node1: the directory /nonexistent does not exist");
  EXPECT_TRUE(contains(c.fix, "make /nonexistent an existing directory"));
}

TEST(DoctorChecks, WriteSaysWhenAParentOfCheckpointDirWasTested) {
  DoctorOptions from_config;
  from_config.dir = "/ckpt/run7";
  from_config.dir_from_config = true;
  Check c = run("checkpoint_write", one_host_two_gpus(), from_config);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_TRUE(contains(c.detail, "checkpoint.dir /ckpt/run7 does not exist yet"));
}

TEST(DoctorChecks, GpuHealthOkUnder85CAndWarnsAt85) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[1].gpu->temperature_c = 84;
  Check c = run("gpu_health", ranks);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_TRUE(contains(c.detail,
                       "rank 0 node1 cuda:0: 41 C, 72 W of 700 W, SM clock 1980 of "
                       "1980 MHz; rank 1 node1 cuda:1: 84 C"));
  ranks[1].gpu->temperature_c = 85;
  c = run("gpu_health", ranks);
  EXPECT_EQ(c.verdict, Verdict::Warn);
  EXPECT_TRUE(contains(c.fix, "a GPU at 85 C or more throttles its clock"));
}

TEST(DoctorChecks, GpuHealthWithoutNvmlOrGpuIsNotAFailure) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[0].gpu->nvml = false;
  ranks[0].gpu->nvml_status = "libnvidia-ml.so not found";
  Check c = run("gpu_health", ranks);
  EXPECT_EQ(c.verdict, Verdict::Ok);
  EXPECT_TRUE(contains(c.detail, "rank 0 node1 cuda:0: NVML not available (libnvidia-ml.so"));
  ranks[0].gpu_count = 0;  // one rank without GPUs: the job runs on the CPU
  EXPECT_EQ(run("gpu_health", ranks).detail, "no GPU");
}

TEST(DoctorProbes, LikelyNcclInterfaceFollowsNcclsOrder) {
  const std::vector<Interface> all = {{"lo", "127.0.0.1", true},
                                      {"docker0", "172.17.0.1", true},
                                      {"eth0", "10.0.0.1", true},
                                      {"ib0", "192.168.0.1", false}};
  EXPECT_EQ(likely_nccl_interface(all, nullptr), "eth0");  // ib0 is down
  EXPECT_EQ(likely_nccl_interface(all, ""), "eth0");
  EXPECT_EQ(likely_nccl_interface(all, "^eth,lo"), "docker0");
  EXPECT_EQ(likely_nccl_interface(all, "=eth"), "");
  EXPECT_EQ(likely_nccl_interface(all, "=eth0"), "eth0");
  EXPECT_EQ(likely_nccl_interface(all, "ib"), "");
  EXPECT_EQ(likely_nccl_interface({all[0]}, nullptr), "lo");
}

TEST(DoctorReport, JsonListsEachRanksFactsAndTheVerdict) {
  std::vector<RankFacts> ranks = one_host_two_gpus();
  ranks[1].gpu.reset();
  std::vector<Check> checks = {run("world", ranks), run("network", ranks)};
  testing::internal::CaptureStdout();
  print_json(checks, ranks, "cpu");
  const std::string json = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(contains(json, "{\"verdict\":\"fail\",\"ranks\":2,\"hosts\":1,\"device\":\"cpu\""));
  EXPECT_TRUE(contains(json, "\"gpu\":0,\"gpu_count\":2,\"gpu_name\":\"NVIDIA H100\""));
  EXPECT_TRUE(contains(json, "\"nvml\":\"1\",\"nvml_status\":\"ok\",\"p2p_pairs\":2"));
  EXPECT_TRUE(contains(json, "\"power_w\":71.5,\"rank\":0"));
  EXPECT_TRUE(contains(json, "{\"gpu\":-1,\"gpu_count\":2,\"host\":\"node1\""));
  testing::internal::CaptureStdout();
  print_table(checks, ranks, "cpu");
  const std::string table = testing::internal::GetCapturedStdout();
  EXPECT_TRUE(contains(table, "    1  node1            1/2    -       -                 -\n"));
  EXPECT_TRUE(contains(table, "\nVERDICT fail: 1 ok, 0 warn, 1 fail\n"));
}

}  // namespace
}  // namespace kiln::launch::doctor
