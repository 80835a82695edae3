; ModuleID = 'bpf'
source_filename = "bpf"
target datalayout = "e-m:e-p270:32:32-p271:32:32-p272:64:64-i64:64-i128:128-f80:128-n8:16:32:64-S128"
target triple = "x86_64-pc-linux-gnu"

; Function Attrs: nounwind
define i64 @bpf_entry(i64 %0, i64 %1, i64 %2) local_unnamed_addr #0 {
prologue:
  %stack = alloca [64 x i64], align 8
  %fp_base = ptrtoint ptr %stack to i64
  %slot = getelementptr inbounds i8, ptr %stack, i64 504
  store i64 0, ptr %slot, align 8
  %addr = add i64 %0, 4
  %ptr = inttoptr i64 %addr to ptr
  %ld = load i32, ptr %ptr, align 1
  %zext = zext i32 %ld to i64
  store i32 %ld, ptr %slot, align 8
  %add = add i64 %fp_base, 504
  %helper1 = call i64 inttoptr (i64 4096 to ptr)(i64 %zext, i64 %add, i64 0, i64 0, i64 0) #0
  %cond = icmp eq i64 %helper1, 0
  br i1 %cond, label %common.ret, label %pc8

common.ret:                                       ; preds = %prologue, %pc8
  %common.ret.op = phi i64 [ %ld18, %pc8 ], [ 0, %prologue ]
  ret i64 %common.ret.op

pc8:                                              ; preds = %prologue
  %ptr17 = inttoptr i64 %helper1 to ptr
  %ld18 = load i64, ptr %ptr17, align 1
  br label %common.ret
}

attributes #0 = { nounwind }
