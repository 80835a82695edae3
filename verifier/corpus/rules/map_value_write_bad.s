# an 8-byte write at offset 12 runs 4 bytes past the value
#@ type kprobe
#@ intent reject
#@ map arr array 4 16 4
stw [%r10-4], 0
mov %r2, %r10
add %r2, -4
ldmap %r1, arr
call 1
jeq %r0, 0, out
stdw [%r0+12], 1
out:
mov %r0, 0
exit
