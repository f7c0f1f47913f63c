/*
 * NVML's GPM ABI (nvml.h, Hopper and later), as much of it as the GPU check's concurrency program
 * and the CPU-only NVML double use: one declaration of the structures both sides must agree on.
 */
#ifndef MQFQ_NVML_GPM_H
#define MQFQ_NVML_GPM_H

typedef int nvmlReturn_t;

/* Opaque to callers; the double defines the structure. */
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;

typedef struct {
    unsigned int version; /* 1 */
    unsigned int isSupportedDevice;
} nvmlGpmSupport_t;

typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    struct { char *shortName; char *longName; char *unit; } metricInfo;
} nvmlGpmMetric_t;

typedef struct {
    unsigned int version; /* 1 */
    unsigned int numMetrics;
    nvmlGpmSample_t sample1;
    nvmlGpmSample_t sample2;
    nvmlGpmMetric_t metrics[98];
} nvmlGpmMetricsGet_t;

enum {
    NVML_GPM_METRIC_SM_UTIL = 2,
    NVML_GPM_METRIC_SM_OCCUPANCY = 3,
    NVML_GPM_METRIC_DRAM_BW_UTIL = 10,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21,
};

#endif
