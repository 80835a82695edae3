# an opcode the ISA does not define
#@ type kprobe
#@ intent reject
.raw 0x00000000000000ff
mov %r0, 1
exit
