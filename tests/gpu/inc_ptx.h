/*
 * inc(p, n): p[i] += 1 for i < n, as PTX the driver JIT-compiles (no CUDA toolkit needed): the
 * kernel of the GPU check's programs that check their results (uvmbench, lifecheck).
 */
#ifndef MQFQ_INC_PTX_H
#define MQFQ_INC_PTX_H
static const char PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry inc(.param .u64 p, .param .u32 n)\n{\n"
    "  .reg .pred %p<2>;\n  .reg .b32 %r<8>;\n  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n  ld.param.u32 %r2, [n];\n"
    "  mov.u32 %r3, %ctaid.x;\n  mov.u32 %r4, %ntid.x;\n  mov.u32 %r5, %tid.x;\n"
    "  mad.lo.s32 %r1, %r3, %r4, %r5;\n  setp.ge.u32 %p1, %r1, %r2;\n  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n  mul.wide.u32 %rd3, %r1, 4;\n  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n  add.s32 %r7, %r6, 1;\n  st.global.u32 [%rd4], %r7;\n"
    "DONE:\n  ret;\n}\n";

#endif
