/* Hopper's sm_90a instructions from OpenCL C on NVIDIA's OpenCL, whose
 * compiler targets sm_90 (src/sm90a.c). A kernel carries each sm_90a
 * instruction as inline PTX inside a comment that starts with
 * CLATTN_SM90A_MARK (cl/mma/wgmma.cl's SM90A), so that its source builds for
 * sm_90 with the operands filled in; the program's PTX, made sm_90a here,
 * then builds through clCreateProgramWithBinary. */
#ifndef CLATTN_SM90A_H
#define CLATTN_SM90A_H

#define CLATTN_SM90A_MARK "// SM90A "

/* What clattn_sm90a_ptx says. */
enum { CLATTN_SM90A_OK, CLATTN_SM90A_NOT_SM90, CLATTN_SM90A_NO_MEMORY };

/* ptx (an sm_90 program's PTX text) with its target renamed sm_90a and the
 * markers removed, into *out (new memory, the caller's to free; NULL
 * unless CLATTN_SM90A_OK). CLATTN_SM90A_NOT_SM90 where ptx names no
 * ".target sm_90,". */
int clattn_sm90a_ptx(const char *ptx, char **out);

#endif
