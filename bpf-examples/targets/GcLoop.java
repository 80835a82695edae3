// SPDX-License-Identifier: MIT
// javagc's target (tests/tests/libbpf_tools.rs): prints "pid=<pid>", waits for a line on
// stdin, calls System.gc() N times, then prints "gcs=<collections the JVM counted>".
// Run with -XX:+UseSerialGC and a heap large enough that only the explicit collections
// happen, each one full collection (HotSpot's gc__begin/gc__end USDT probes once).
import java.io.*;
import java.lang.management.*;
public class GcLoop {
    public static void main(String[] a) throws Exception {
        int n = Integer.parseInt(a[0]);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("pid=" + ProcessHandle.current().pid());
        System.out.flush();
        in.readLine();
        for (int i = 0; i < n; i++) System.gc();
        long c = 0;
        for (GarbageCollectorMXBean g : ManagementFactory.getGarbageCollectorMXBeans()) c += g.getCollectionCount();
        System.out.println("gcs=" + c);
    }
}
