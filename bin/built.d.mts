export declare function sourcesDigest(root: string): string;
export declare function builtEntry(root: string): string | undefined;
